package budget

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/budget/money"
)

func TestCost(t *testing.T) {
	p := Prices{VCPUHour: 50_400, MemoryGiBHour: 5_600, PausedMemoryGiBHour: 1_000, DiskGBHour: 140, SnapshotGBHour: 70}
	for _, c := range []struct {
		r    Resources
		d    time.Duration
		want money.USD
	}{
		{Resources{VCPUs: 1}, time.Hour, 50_400},
		{Resources{VCPUs: 2, MemoryMB: 2048, DiskGB: 20}, time.Hour, 2*50_400 + 2*5_600 + 20*140},
		// 1 vCPU for one second: 14 micro-dollars exactly.
		{Resources{VCPUs: 1}, time.Second, 14},
		// Rounded up, never down: one nanosecond of anything costs a micro-dollar.
		{Resources{VCPUs: 1}, time.Nanosecond, 1},
		// 512 MiB is half a GiB.
		{Resources{MemoryMB: 512}, time.Hour, 2_800},
		// Paused: only the paused prices (and the disk).
		{Resources{VCPUs: 4, MemoryMB: 1024, DiskGB: 1, Paused: true}, time.Hour, 1_000 + 140},
		// Snapshot storage, per 10^9 bytes, exact and rounded up.
		{Resources{SnapshotBytes: 3_000_000_000}, time.Hour, 210},
		{Resources{DiskGB: 1, SnapshotBytes: 500_000_000}, time.Hour, 140 + 35},
		{Resources{SnapshotBytes: 1}, time.Second, 1},
		{Resources{VCPUs: 1}, 0, 0},
		{Resources{VCPUs: 1}, -time.Hour, 0},
		// A century of a huge machine does not overflow: it is capped.
		{Resources{VCPUs: 1 << 30, MemoryMB: 1 << 40, DiskGB: 1 << 30}, 100 * 365 * 24 * time.Hour, money.MaxUSD},
	} {
		if got := p.Cost(c.r, c.d); got != c.want {
			t.Errorf("Cost(%+v, %v) = %d, want %d", c.r, c.d, got, c.want)
		}
	}
}

func TestLoadPrices(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		f := filepath.Join(dir, "prices.json")
		os.WriteFile(f, []byte(s), 0o600)
		return f
	}
	p, err := LoadPrices(write(`{"vcpu_hour": "0.10"}`))
	if err != nil || p.VCPUHour != 100_000 || p.MemoryGiBHour != DefaultPrices.MemoryGiBHour {
		t.Fatalf("%+v %v", p, err)
	}
	for in, want := range map[string]string{
		`{"vcpu_hours": "1"}`: "unknown field",
		`{"vcpu_hour": "-1"}`: "not a dollar amount",
		`{"vcpu_hour": 1e3}`:  "not a dollar amount",
	} {
		if _, err := LoadPrices(write(in)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", in, err, want)
		}
	}
}

func TestEgressCost(t *testing.T) {
	p := Prices{EgressGB: 90_000}
	for n, want := range map[uint64]money.USD{0: 0, 1: 1, 1_000_000_000: 90_000, 1_500_000_000: 135_000, 1<<64 - 1: 1_660_206_966_633_860} {
		if got := p.EgressCost(n); got != want {
			t.Errorf("EgressCost(%d) = %d, want %d", n, got, want)
		}
	}
	if got := (Prices{EgressGB: money.MaxUSD}).EgressCost(1<<64 - 1); got != money.MaxUSD {
		t.Errorf("a huge egress cost is %d, want the cap", got)
	}
}
