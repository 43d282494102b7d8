package harebox_test

import (
	"context"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/sandbox"
)

// BenchmarkAuditOverhead is what the audit log costs a request, measured
// in one run on the fake hypervisor (so the call itself is as cheap as it
// gets): an exec, which is recorded (one append), against one append to
// the same log alone, the two alternated so that neither gets the warmer
// cache. exec-on/off is the exec's time against that time less the
// append's; a get is not recorded, and get-µs/op is there to compare.
func BenchmarkAuditOverhead(b *testing.B) {
	ctx := context.Background()
	eng, _ := memhvEngine(b, func(o *harebox.Options) {
		o.HealthInterval, o.MeterInterval, o.MetricsInterval = -1, time.Hour, -1
	})
	s, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		b.Fatal(err)
	}
	req := sandbox.ExecRequest{Cmd: "echo hi"}
	var get, exec, appends time.Duration
	b.ResetTimer()
	for n := range b.N {
		start := time.Now()
		if _, err := eng.Get(ctx, s.ID); err != nil {
			b.Fatal(err)
		}
		get += time.Since(start)
		record := func() {
			start := time.Now()
			eng.Audit().Record(ctx, "execCommand", s.AccountID, s.ID, nil)
			appends += time.Since(start)
		}
		if n%2 == 1 {
			record()
		}
		start = time.Now()
		if _, err := eng.Exec(ctx, s.ID, req); err != nil {
			b.Fatal(err)
		}
		exec += time.Since(start)
		if n%2 == 0 {
			record()
		}
	}
	b.ReportMetric(float64(exec)/float64(exec-appends), "exec-on/off")
	b.ReportMetric(float64(appends.Microseconds())/float64(b.N), "append-µs/op")
	b.ReportMetric(float64(exec.Microseconds())/float64(b.N), "exec-µs/op")
	b.ReportMetric(float64(get.Microseconds())/float64(b.N), "get-µs/op")
}
