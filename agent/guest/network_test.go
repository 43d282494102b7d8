package guest

import (
	"strings"
	"testing"
)

func TestParseNetworkConfig(t *testing.T) {
	c, err := ParseNetworkConfig("console=ttyS0 harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.dns=10.231.0.1 harebox.mac=02:aa:bb:cc:dd:ee quiet\n")
	if err != nil || c == nil {
		t.Fatal(c, err)
	}
	if c.Addr.String() != "10.231.0.2/30" || c.Gateway.String() != "10.231.0.1" || c.DNS.String() != "10.231.0.1" || c.MAC.String() != "02:aa:bb:cc:dd:ee" {
		t.Errorf("got %+v", c)
	}
	if c.Mesh.IsValid() {
		t.Errorf("a mesh without the parameter: %v", c.Mesh)
	}
	c, err = ParseNetworkConfig("harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.mesh=10.240.4.5/22")
	if err != nil || c.Mesh.String() != "10.240.4.5/22" {
		t.Errorf("mesh: %+v %v", c, err)
	}
	if c, err := ParseNetworkConfig("console=ttyS0 quiet"); c != nil || err != nil {
		t.Errorf("no params: %v %v", c, err)
	}
	for _, bad := range []string{
		"harebox.ip=10.231.0.2",
		"harebox.ip=fd00::2/64 harebox.gw=fd00::1",
		"harebox.ip=10.231.0.2/30 harebox.gw=10.9.9.9",
		"harebox.ip=10.231.0.2/30",
		"harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.dns=x",
		"harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.mac=zz",
		"harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.mesh=10.240.4.5",
		"harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.mesh=fd00::5/64",
		"harebox.ip=10.231.0.2/30 harebox.gw=10.231.0.1 harebox.mesh=10.231.0.2/24",
	} {
		if _, err := ParseNetworkConfig(bad); err == nil || !strings.Contains(err.Error(), "harebox.") {
			t.Errorf("%q: %v", bad, err)
		}
	}
	// After "--" the words are init's arguments.
	if c, _ := ParseNetworkConfig("-- harebox.ip=10.0.0.2/30 harebox.gw=10.0.0.1"); c != nil {
		t.Errorf("read past --: %+v", c)
	}
}
