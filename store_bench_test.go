package harebox

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/images"
	"github.com/harebox/harebox/internal/testpg"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// BenchmarkStores is the engine's create (admission: placement, budget
// reservation, record, audit entry, on the fake hypervisor) and get on a
// real PostgreSQL server against SQLite, in one run: the ratios
// postgres/sqlite and each one's time per call.
func BenchmarkStores(b *testing.B) {
	ctx := context.Background()
	dsn := testpg.ForTest(b)
	open := func(st store.Store) *Engine {
		dir, err := os.MkdirTemp("", "hbm")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		hv := memhv.New(memhv.Options{})
		b.Cleanup(func() { hv.Close() })
		eng, err := New(ctx, Options{DataDir: dir, Hypervisor: hv, HealthInterval: -1, MeterInterval: time.Hour, MetricsInterval: -1,
			Images: map[string]images.Image{sandbox.DefaultImage: memhv.Image(dir)}, Store: st,
			Capacity: Capacity{VCPUs: 1 << 20, MemoryMB: 1 << 30, DiskGB: 1 << 20}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { eng.Close() })
		return eng
	}
	db, err := store.OpenPostgres(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	engines := [2]*Engine{open(nil), open(db)} // sqlite, postgres
	var create, get [2]time.Duration
	b.ResetTimer()
	for n := range b.N {
		order := []int{0, 1}
		if n%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			start := time.Now()
			s, err := engines[i].Create(ctx, sandbox.CreateRequest{})
			if err != nil {
				b.Fatal(err)
			}
			create[i] += time.Since(start)
			start = time.Now()
			if _, err := engines[i].Get(ctx, s.ID); err != nil {
				b.Fatal(err)
			}
			get[i] += time.Since(start)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(create[1])/float64(create[0]), "create-pg/sqlite")
	b.ReportMetric(float64(get[1])/float64(get[0]), "get-pg/sqlite")
	b.ReportMetric(float64(create[1].Microseconds())/float64(b.N), "create-pg-µs/op")
	b.ReportMetric(float64(create[0].Microseconds())/float64(b.N), "create-sqlite-µs/op")
	b.ReportMetric(float64(get[1].Microseconds())/float64(b.N), "get-pg-µs/op")
	b.ReportMetric(float64(get[0].Microseconds())/float64(b.N), "get-sqlite-µs/op")
}
