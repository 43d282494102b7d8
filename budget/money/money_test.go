package money

import (
	"encoding/json"
	"testing"
)

func TestUSD(t *testing.T) {
	for in, want := range map[string]USD{"0": 0, "25": 25_000_000, "25.5": 25_500_000, "0.000001": 1, "1000000000000": MaxUSD} {
		got, err := ParseUSD(in)
		if err != nil || got != want {
			t.Errorf("ParseUSD(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "1.", ".5", "1.0000001", "1e3", "abc", "1000000000000.000001", "99999999999999999999"} {
		if v, err := ParseUSD(in); err == nil {
			t.Errorf("ParseUSD(%q) = %d, want an error", in, v)
		}
	}
	for v, want := range map[USD]string{0: "0.00", 25_000_000: "25.00", 25_500_000: "25.50", 1: "0.000001", -1_500_000: "-1.50"} {
		if got := v.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int64(v), got, want)
		}
	}
	var v struct{ B USD }
	if err := json.Unmarshal([]byte(`{"B": "10.25"}`), &v); err != nil || v.B != 10_250_000 {
		t.Fatalf("%v %d", err, v.B)
	}
	if b, _ := json.Marshal(v); string(b) != `{"B":"10.25"}` {
		t.Fatalf("marshal: %s", b)
	}
}
