package testserver

import (
	"encoding/json"
	"strings"
	"testing"
)

// ProbeBench is what the mesh's probe (e2e/testdata/meshprobe) prints in
// its bench mode: the p50 of its one-byte round trips, and its throughput.
type ProbeBench struct {
	RTT float64 `json:"rtt_p50_us"`
	MiB float64 `json:"mib_per_s"`
}

// ParseProbeBench reads out, what the probe printed for what; the
// benchmark ends if it is not a measurement.
func ParseProbeBench(b *testing.B, what, out string) ProbeBench {
	b.Helper()
	var r ProbeBench
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil || r.MiB == 0 {
		b.Fatalf("%s: %q %v", what, out, err)
	}
	return r
}

// Report reports r (named name) beside base (named baseName), and their
// ratios.
func (r ProbeBench) Report(b *testing.B, name string, base ProbeBench, baseName string) {
	b.ReportMetric(r.RTT, name+"-rtt-p50-us")
	b.ReportMetric(base.RTT, baseName+"-rtt-p50-us")
	b.ReportMetric(r.RTT/base.RTT, name+"/"+baseName+"-rtt")
	b.ReportMetric(r.MiB, name+"-MiB/s")
	b.ReportMetric(base.MiB, baseName+"-MiB/s")
	b.ReportMetric(r.MiB/base.MiB, name+"/"+baseName+"-throughput")
}
