package firewall

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

// walkthrough is the README's policy: pypi only.
const walkthrough = `{"default_outbound": "deny", "outbound": [
 {"action": "allow", "protocol": "tcp", "ports": "443", "hosts": ["pypi.org", "files.pythonhosted.org"]}]}`

func TestParseGood(t *testing.T) {
	p, err := Parse([]byte(walkthrough))
	if err != nil {
		t.Fatal(err)
	}
	want := &Policy{DefaultOutbound: Deny, Outbound: []Rule{{Action: Allow, Protocol: TCP, Ports: "443", Hosts: []string{"pypi.org", "files.pythonhosted.org"}}}}
	if !reflect.DeepEqual(p, want) {
		t.Fatalf("got %+v, want %+v", p, want)
	}

	p, err = Parse([]byte(`{"default_outbound":"allow","outbound":[
	  {"action":"deny","hosts":["*.Example.COM."]},
	  {"action":"allow","protocol":"udp","ports":"9000-9100, 53 ,80,81,82","cidrs":["10.1.0.0/16","198.18.0.7"]},
	  {"action":"deny","protocol":"icmp"},
	  {"action":"allow","ports":8080,"protocol":"tcp"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	r := p.Outbound
	if r[0].Protocol != TCP || r[0].Hosts[0] != "*.example.com" {
		t.Errorf("host rule not normalized: %+v", r[0])
	}
	if r[1].Ports != "53,80-82,9000-9100" || r[1].CIDRs[1] != "198.18.0.7/32" {
		t.Errorf("ports/cidrs not normalized: %+v", r[1])
	}
	if r[3].Ports != "8080" {
		t.Errorf("numeric ports: %+v", r[3])
	}
	if p, err := Parse([]byte(`{"default_outbound":"allow"}`)); err != nil || p.Outbound == nil {
		t.Errorf("no rules: %v %+v", err, p)
	}

	// Mesh rules: normalized, and matched on fleet (name or ID) and labels.
	p, err = Parse([]byte(`{"default_outbound":"deny","mesh":[
	  {"action":"allow","protocol":"tcp","ports":"8080, 5432","fleet":"db","labels":{"tier":"data"}},
	  {"action":"deny"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	m := p.Mesh
	if len(m) != 2 || m[0].Ports != "5432,8080" || m[1].Protocol != Any {
		t.Fatalf("mesh rules not normalized: %+v", m)
	}
	for _, c := range []struct {
		peer Peer
		want bool
	}{
		{Peer{Fleet: "db", Labels: map[string]string{"tier": "data", "x": "y"}}, true},
		{Peer{FleetID: "db", Labels: map[string]string{"tier": "data"}}, true},
		{Peer{Fleet: "db", Labels: map[string]string{"tier": "web"}}, false},
		{Peer{Fleet: "web", Labels: map[string]string{"tier": "data"}}, false},
		{Peer{Fleet: "db"}, false},
	} {
		if got := m[0].Matches(c.peer); got != c.want {
			t.Errorf("rule %+v matches %+v: %v", m[0], c.peer, got)
		}
	}
	if !m[1].Matches(Peer{}) {
		t.Error("a rule without fleet or labels does not match every peer")
	}
	if q := p.Clone(); &q.Mesh[0] == &p.Mesh[0] || !reflect.DeepEqual(q, p) {
		t.Error("Clone does not copy the mesh rules")
	}
}

func TestParseBad(t *testing.T) {
	rule := func(s string) string { return `{"default_outbound":"deny","outbound":[` + s + `]}` }
	many := make([]string, MaxRules+1)
	for i := range many {
		many[i] = `{"action":"allow"}`
	}
	mesh := func(s string) string { return `{"default_outbound":"deny","mesh":[` + s + `]}` }
	labels := make([]string, MaxMeshLabels+1)
	for i := range labels {
		labels[i] = fmt.Sprintf(`"k%d":"v"`, i)
	}
	manyLabels := "{" + strings.Join(labels, ",") + "}"
	hosts := make([]string, MaxHostsPerRule+1)
	for i := range hosts {
		hosts[i] = `"a.example.com"`
	}
	for _, c := range []struct{ in, field, msg string }{
		{``, "", "not valid JSON"},
		{`[]`, "", "JSON object"},
		{`null`, "", "JSON object"},
		{`{"default_outbound":"deny"} {}`, "", "trailing"},
		{`{"default_outbound":"deny","outbound":[]}x`, "", "trailing"},
		{`{}`, "default_outbound", "required"},
		{`{"default_outbound":"maybe"}`, "default_outbound", `"allow" or "deny"`},
		{`{"default_outbound":null}`, "default_outbound", "string"},
		{`{"default_outbound":"deny","Default_Outbound":"allow"}`, "Default_Outbound", "unknown field"},
		{`{"default_outbound":"deny","default_outbound":"allow"}`, "default_outbound", "duplicate"},
		{`{"default_outbound":"deny","inbound":[]}`, "inbound", "unknown field"},
		{`{"default_outbound":"deny","outbound":{}}`, "outbound", "array"},
		{`{"default_outbound":"deny","outbound":[` + strings.Join(many, ",") + `]}`, "outbound", "too many rules"},
		{rule(`{"action":"allow"},{"action":"allow","hostz":["a.com"]}`), "outbound[1].hostz", "unknown field"},
		{rule(`{"action":"allow","action":"deny"}`), "outbound[0].action", "duplicate"},
		{rule(`{}`), "outbound[0].action", "required"},
		{rule(`{"action":"permit"}`), "outbound[0].action", "must be"},
		{rule(`{"action":"allow","protocol":"sctp"}`), "outbound[0].protocol", "must be"},
		{rule(`{"action":"allow","protocol":"tcp","ports":"0"}`), "outbound[0].ports", "out of range"},
		{rule(`{"action":"allow","protocol":"tcp","ports":"65536"}`), "outbound[0].ports", "out of range"},
		{rule(`{"action":"allow","protocol":"tcp","ports":"9000-8000"}`), "outbound[0].ports", "backwards"},
		{rule(`{"action":"allow","protocol":"tcp","ports":"80,,443"}`), "outbound[0].ports", "empty port"},
		{rule(`{"action":"allow","protocol":"tcp","ports":"http"}`), "outbound[0].ports", "bad port"},
		{rule(`{"action":"allow","protocol":"tcp","ports":"-5"}`), "outbound[0].ports", "empty port"},
		{rule(`{"action":"allow","protocol":"tcp","ports":"1-2-3"}`), "outbound[0].ports", "bad port"},
		{rule(`{"action":"allow","protocol":"tcp","ports":""}`), "outbound[0].ports", ""},
		{rule(`{"action":"allow","protocol":"tcp","ports":"` + strings.Repeat("1,", MaxPortSpans) + `1"}`), "outbound[0].ports", "too many"},
		{rule(`{"action":"allow","protocol":"icmp","ports":"443"}`), "outbound[0].ports", "need protocol"},
		{rule(`{"action":"allow","protocol":"any","ports":"443"}`), "outbound[0].ports", "need protocol"},
		{rule(`{"action":"allow","ports":"443"}`), "outbound[0].ports", "need protocol"},
		{rule(`{"action":"allow","protocol":"udp","hosts":["pypi.org"]}`), "outbound[0].protocol", "tcp only"},
		{rule(`{"action":"allow","protocol":"any","hosts":["pypi.org"]}`), "outbound[0].protocol", "tcp only"},
		{rule(`{"action":"allow","hosts":["pypi.org"],"cidrs":["10.0.0.0/8"]}`), "outbound[0]", "not both"},
		{rule(`{"action":"allow","hosts":[]}`), "outbound[0].hosts", "empty"},
		{rule(`{"action":"allow","hosts":"pypi.org"}`), "outbound[0].hosts", "array of strings"},
		{rule(`{"action":"allow","hosts":[1]}`), "outbound[0].hosts[0]", "string"},
		{rule(`{"action":"allow","hosts":["1.2.3.4"]}`), "outbound[0].hosts[0]", "IP address"},
		{rule(`{"action":"allow","hosts":["::1"]}`), "outbound[0].hosts[0]", "IP address"},
		{rule(`{"action":"allow","hosts":["[::1]"]}`), "outbound[0].hosts[0]", "IP address"},
		{rule(`{"action":"allow","hosts":["10.0.0.0/8"]}`), "outbound[0].hosts[0]", "CIDR"},
		{rule(`{"action":"allow","hosts":["a..b"]}`), "outbound[0].hosts[0]", "empty label"},
		{rule(`{"action":"allow","hosts":["-a.com"]}`), "outbound[0].hosts[0]", "'-'"},
		{rule(`{"action":"allow","hosts":["a_b.com"]}`), "outbound[0].hosts[0]", "not allowed"},
		{rule(`{"action":"allow","hosts":["a.*.com"]}`), "outbound[0].hosts[0]", "first label"},
		{rule(`{"action":"allow","hosts":["*"]}`), "outbound[0].hosts[0]", "first label"},
		{rule(`{"action":"allow","hosts":["*.com"]}`), "outbound[0].hosts[0]", "too broad"},
		{rule(`{"action":"allow","hosts":["1.2.3"]}`), "outbound[0].hosts[0]", "all digits"},
		{rule(`{"action":"allow","hosts":["` + strings.Repeat("a", 64) + `.com"]}`), "outbound[0].hosts[0]", "63"},
		{rule(`{"action":"allow","hosts":["` + strings.Repeat("abcdefg.", 32) + `com"]}`), "outbound[0].hosts[0]", "longer than"},
		{rule(`{"action":"allow","hosts":[""]}`), "outbound[0].hosts[0]", "empty"},
		{rule(`{"action":"allow","hosts":[` + strings.Join(hosts, ",") + `]}`), "outbound[0].hosts", "too many"},
		{rule(`{"action":"allow","cidrs":["10.0.0.1/8"]}`), "outbound[0].cidrs[0]", "host bits"},
		{rule(`{"action":"allow","cidrs":["fd00::/8"]}`), "outbound[0].cidrs[0]", "IPv4"},
		{rule(`{"action":"allow","cidrs":["::ffff:10.0.0.1"]}`), "outbound[0].cidrs[0]", "IPv4"},
		{rule(`{"action":"allow","cidrs":["10.0.0.0/33"]}`), "outbound[0].cidrs[0]", "not a CIDR"},
		{rule(`{"action":"allow","cidrs":["pypi.org"]}`), "outbound[0].cidrs[0]", "not a CIDR"},
		{rule(`{"action":"allow","cidrs":null}`), "outbound[0].cidrs", "array"},
		{mesh(`{}`), "mesh[0].action", "required"},
		{mesh(`{"action":"allow","protocol":"icmp"}`), "mesh[0].protocol", "must be"},
		{mesh(`{"action":"allow","ports":"80"}`), "mesh[0].ports", "need protocol"},
		{mesh(`{"action":"allow","protocol":"tcp","ports":"0"}`), "mesh[0].ports", "out of range"},
		{mesh(`{"action":"allow","fleet":""}`), "mesh[0].fleet", "empty"},
		{mesh(`{"action":"allow","fleet":7}`), "mesh[0].fleet", "string"},
		{mesh(`{"action":"allow","labels":{}}`), "mesh[0].labels", "empty"},
		{mesh(`{"action":"allow","labels":{"a":1}}`), "mesh[0].labels.a", "string"},
		{mesh(`{"action":"allow","labels":{"":"x"}}`), "mesh[0].labels", "a key of 1"},
		{mesh(`{"action":"allow","labels":` + manyLabels + `}`), "mesh[0].labels", "too many"},
		{mesh(`{"action":"allow","cidrs":["10.0.0.0/8"]}`), "mesh[0].cidrs", "unknown field"},
		{`{"default_outbound":"deny","mesh":{}}`, "mesh", "array"},
	} {
		_, err := Parse([]byte(c.in))
		var fe *Error
		if !errors.As(err, &fe) {
			t.Errorf("%s: got %v, want *Error", c.in, err)
			continue
		}
		if fe.Field != c.field || !strings.Contains(fe.Msg, c.msg) {
			t.Errorf("%.80s:\n got field %q msg %q\nwant field %q msg containing %q", c.in, fe.Field, fe.Msg, c.field, c.msg)
		}
	}
	if _, err := Parse(make([]byte, MaxPolicyBytes+1)); err == nil || !strings.Contains(err.Error(), "larger") {
		t.Errorf("huge policy: %v", err)
	}
}

func TestValidateDoesNotMutate(t *testing.T) {
	p := &Policy{DefaultOutbound: Deny, Outbound: []Rule{{Action: Allow, Hosts: []string{"PyPI.org."}, Ports: "443,80"}}}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.Outbound[0].Hosts[0] != "PyPI.org." || p.Outbound[0].Protocol != "" {
		t.Errorf("Validate changed the policy: %+v", p.Outbound[0])
	}
	if err := (&Policy{DefaultOutbound: "x"}).Validate(); err == nil {
		t.Error("bad default accepted")
	}
	if err := (*Policy)(nil).Validate(); err == nil {
		t.Error("nil accepted")
	}
	if Default().Validate() != nil || DenyAll().Validate() != nil {
		t.Error("built-in policies invalid")
	}
}

func TestDecide(t *testing.T) {
	b := Blocked(append(append(AlwaysInternal(), DefaultPrivate()...), netip.MustParsePrefix("10.231.0.0/16")))
	walk, _ := Parse([]byte(walkthrough))
	mixed, err := Parse([]byte(`{"default_outbound":"allow","outbound":[
	  {"action":"allow","protocol":"tcp","ports":"5432","cidrs":["10.1.0.0/16"]},
	  {"action":"allow","cidrs":["0.0.0.0/0"],"protocol":"udp"},
	  {"action":"deny","hosts":["*.evil.test"]},
	  {"action":"deny","protocol":"tcp","ports":"25"},
	  {"action":"allow","cidrs":["10.231.0.4/30"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// A CIDR rule opens 10.5/16 for Postgres only; a name that resolves
	// there must not reach other ports of it.
	named, err := Parse([]byte(`{"default_outbound":"deny","outbound":[
	  {"action":"allow","protocol":"tcp","ports":"5432","cidrs":["10.5.0.0/16"]},
	  {"action":"allow","protocol":"tcp","ports":"443,5432","hosts":["*.x.test"]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddr
	for i, c := range []struct {
		p     *Policy
		c     Conn
		allow bool
		rule  int
	}{
		{walk, Conn{TCP, 443, "pypi.org", a("198.18.0.10")}, true, 0},
		{walk, Conn{TCP, 443, "PyPI.org.", a("198.18.0.10")}, true, 0},
		{walk, Conn{TCP, 443, "files.pythonhosted.org", a("198.18.0.11")}, true, 0},
		{walk, Conn{TCP, 443, "example.com", a("198.18.0.12")}, false, -1},
		{walk, Conn{TCP, 443, "evilpypi.org", a("198.18.0.12")}, false, -1},
		{walk, Conn{TCP, 8443, "pypi.org", a("198.18.0.10")}, false, -1},
		{walk, Conn{TCP, 443, "", a("198.18.0.10")}, false, -1}, // no name: IP literal
		{walk, Conn{UDP, 443, "", a("198.18.0.10")}, false, -1},
		{mixed, Conn{TCP, 5432, "", a("10.1.2.3")}, true, 0},
		{mixed, Conn{TCP, 5432, "", a("10.2.2.3")}, false, -1}, // private, not named
		{mixed, Conn{UDP, 5432, "", a("10.1.2.3")}, false, -1}, // 0/0 names nothing internal
		{mixed, Conn{UDP, 5000, "", a("198.18.0.1")}, true, 1}, // public via 0/0
		{mixed, Conn{UDP, 5000, "", a("169.254.169.254")}, false, -1},
		{mixed, Conn{TCP, 443, "a.evil.test", a("198.18.0.1")}, false, 2},
		{mixed, Conn{TCP, 443, "evil.test", a("198.18.0.1")}, true, -1}, // *. excludes the apex
		{mixed, Conn{TCP, 25, "", a("198.18.0.1")}, false, 3},
		{mixed, Conn{ICMP, 0, "", a("198.18.0.1")}, true, -1},
		{mixed, Conn{ICMP, 0, "", a("10.231.0.6")}, true, 4},               // named sandbox range
		{mixed, Conn{ICMP, 0, "", a("10.231.0.9")}, false, -1},             // other sandbox
		{mixed, Conn{ICMP, 0, "", a("255.255.255.255")}, false, -1},        // broadcast
		{mixed, Conn{ICMP, 0, "", a("224.0.0.1")}, false, -1},              // multicast
		{walk, Conn{TCP, 443, "pypi.org", a("169.254.169.254")}, false, 0}, // a name never opens metadata
		{walk, Conn{TCP, 443, "pypi.org", a("10.0.0.1")}, false, 0},
		{named, Conn{TCP, 443, "db.x.test", a("10.5.1.1")}, false, 1},  // a name does not open 443 there
		{named, Conn{TCP, 5432, "db.x.test", a("10.5.1.1")}, true, 0},  // the CIDR rule opens 5432
		{named, Conn{TCP, 443, "db.x.test", a("198.18.0.1")}, true, 1}, // public: the name rule decides
		{named, Conn{TCP, 5432, "", a("10.5.1.1")}, true, 0},
	} {
		v := c.p.Decide(b, c.c)
		if v.Allow != c.allow || v.Rule != c.rule {
			t.Errorf("%d %+v: got %+v, want allow=%v rule=%d", i, c.c, v, c.allow, c.rule)
		}
	}
	if !walk.Resolvable("pypi.org") || walk.Resolvable("example.com") || !mixed.Resolvable("example.com") || mixed.Resolvable("x.evil.test") {
		t.Error("Resolvable")
	}
	if all, spans := walk.HostPorts(); all || !reflect.DeepEqual(spans, []PortSpan{{443, 443}}) {
		t.Errorf("HostPorts: %v %v", all, spans)
	}
	if all, _ := mixed.HostPorts(); !all {
		t.Error("HostPorts of a portless host rule should be all")
	}
}

func TestGuard(t *testing.T) {
	b := Blocked{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.231.0.0/16"), netip.MustParsePrefix("169.254.0.0/16")}
	for _, c := range []struct {
		p    string
		want int
	}{{"0.0.0.0/0", 3}, {"10.0.0.0/8", 1}, {"10.231.0.0/24", 0}, {"10.1.0.0/16", 0}, {"8.8.8.0/24", 0}, {"10.0.0.0/7", 2}} {
		if g := b.Guard(netip.MustParsePrefix(c.p)); len(g) != c.want {
			t.Errorf("Guard(%s) = %v, want %d ranges", c.p, g, c.want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(walkthrough))
	f.Add([]byte(`{"default_outbound":"allow","outbound":[{"action":"deny","protocol":"udp","ports":"1-2,3","cidrs":["1.2.3.4"]}]}`))
	f.Add([]byte(`{"default_outbound":"allow","outbound":[{"action":"deny","hosts":["*.a.b"]}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			var fe *Error
			if !errors.As(err, &fe) {
				t.Fatalf("error is not *Error: %v", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatalf("parsed policy does not validate: %v", err)
		}
		// Canonical form is a fixed point.
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		q, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parse of %s: %v", out, err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip changed the policy:\n%+v\n%+v", p, q)
		}
	})
}

// The API's name is open only where an allow rule names it, first.
func TestNamesAPI(t *testing.T) {
	for _, c := range []struct {
		policy    string
		names     bool
		allow80   bool
		allow8080 bool
	}{
		{`{"default_outbound": "allow"}`, false, false, false},
		{`{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "80", "hosts": ["api.harebox.internal"]}]}`, true, true, false},
		{`{"default_outbound": "deny", "outbound": [{"action": "allow", "hosts": ["*.harebox.internal"]}]}`, true, true, true},
		{`{"default_outbound": "allow", "outbound": [{"action": "deny", "hosts": ["api.harebox.internal"]}, {"action": "allow", "hosts": ["api.harebox.internal"]}]}`, false, false, false},
		{`{"default_outbound": "deny", "outbound": [{"action": "allow", "protocol": "tcp", "ports": "80"}, {"action": "allow", "hosts": ["api.harebox.internal"]}]}`, true, false, true},
	} {
		p, err := Parse([]byte(c.policy))
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Names(APIHost); got != c.names {
			t.Errorf("%s: Names = %v", c.policy, got)
		}
		if got := p.NamesAllow(APIHost, 80); got != c.allow80 {
			t.Errorf("%s: NamesAllow 80 = %v", c.policy, got)
		}
		if got := p.NamesAllow(APIHost, 8080); got != c.allow8080 {
			t.Errorf("%s: NamesAllow 8080 = %v", c.policy, got)
		}
	}
}
