package harebox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/sandbox"
)

// BenchmarkAuditOverhead is what the audit log costs a request, as ratios
// of the same calls with the log on and off (off: this engine's log set
// aside, which only a test of this package can do), measured in one run
// on the fake hypervisor: a get (not recorded) and an exec (recorded:
// one append).
func BenchmarkAuditOverhead(b *testing.B) {
	ctx := context.Background()
	open := func() (*Engine, string) {
		dir, err := os.MkdirTemp("", "hbm")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		hv := memhv.New(memhv.Options{})
		b.Cleanup(func() { hv.Close() })
		eng, err := New(ctx, Options{DataDir: dir, Hypervisor: hv, HealthInterval: -1, MeterInterval: time.Hour, MetricsInterval: -1,
			Images: map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)}})
		if err != nil {
			b.Fatal(err)
		}
		s, err := eng.Create(ctx, sandbox.CreateRequest{})
		if err != nil {
			b.Fatal(err)
		}
		return eng, s.ID
	}
	on, onID := open()
	off, offID := open()
	log := off.audit
	off.audit = nil // (every Record is a no-op on a nil log)
	b.Cleanup(func() {
		off.audit = log
		on.Close()
		off.Close()
	})
	var get, exec [2]time.Duration
	req := sandbox.ExecRequest{Cmd: "echo hi"}
	b.ResetTimer()
	type target struct {
		eng *Engine
		id  string
	}
	for n := range b.N {
		// (Alternate which goes first: neither gets the warmer cache.)
		order := []int{0, 1}
		if n%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			e := []target{{on, onID}, {off, offID}}[i]
			start := time.Now()
			if _, err := e.eng.Get(ctx, e.id); err != nil {
				b.Fatal(err)
			}
			get[i] += time.Since(start)
			start = time.Now()
			if _, err := e.eng.Exec(ctx, e.id, req); err != nil {
				b.Fatal(err)
			}
			exec[i] += time.Since(start)
		}
	}
	b.ReportMetric(float64(get[0])/float64(get[1]), "get-on/off")
	b.ReportMetric(float64(exec[0])/float64(exec[1]), "exec-on/off")
	b.ReportMetric(float64(exec[0].Microseconds())/float64(b.N), "exec-on-µs/op")
}
