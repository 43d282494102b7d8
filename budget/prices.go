package budget

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"time"

	"github.com/harebox/harebox/budget/money"
)

// Prices turn reserved resources into money. Every price is per hour, in
// exact micro-dollars; a cost is computed with integers and rounded up
// to the micro-dollar, so a budget never sees less than was used.
type Prices struct {
	// VCPUHour and MemoryGiBHour are charged while a sandbox runs.
	VCPUHour      money.USD `json:"vcpu_hour"`
	MemoryGiBHour money.USD `json:"memory_gib_hour"`
	// PausedVCPUHour and PausedMemoryGiBHour are charged while it is
	// paused (its memory is still held).
	PausedVCPUHour      money.USD `json:"paused_vcpu_hour"`
	PausedMemoryGiBHour money.USD `json:"paused_memory_gib_hour"`
	// DiskGBHour is charged for the disk's reserved size while the
	// sandbox exists, running or paused.
	DiskGBHour money.USD `json:"disk_gb_hour"`
	// SnapshotGBHour is charged per GB (10^9 bytes) of snapshot storage:
	// a snapshot's files, and a hibernated sandbox's.
	SnapshotGBHour money.USD `json:"snapshot_gb_hour"`
	// EgressGB is charged per GB (10^9 bytes) the guest sends out of its
	// network link, as it is metered (it is not known in advance, so it
	// is not reserved).
	EgressGB money.USD `json:"egress_gb"`
}

// DefaultPrices is the price table used when none is configured.
var DefaultPrices = Prices{
	VCPUHour:            50_400, // $0.0504
	MemoryGiBHour:       5_600,  // $0.0056
	PausedVCPUHour:      0,
	PausedMemoryGiBHour: 5_600,
	DiskGBHour:          140,    // $0.00014 (about $0.10 a GB-month)
	SnapshotGBHour:      70,     // $0.00007 (about $0.05 a GB-month)
	EgressGB:            90_000, // $0.09
}

// LoadPrices reads a price table from a JSON file: every price as a
// decimal dollar string, unknown keys refused, a missing key taken from
// DefaultPrices.
func LoadPrices(path string) (Prices, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Prices{}, fmt.Errorf("prices: %w", err)
	}
	p := DefaultPrices
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return Prices{}, fmt.Errorf("prices: %s: %w", path, err)
	}
	return p, nil
}

// EgressCost is what sending n bytes costs, rounded up to the
// micro-dollar.
func (p Prices) EgressCost(n uint64) money.USD {
	num := new(big.Int).Mul(new(big.Int).SetUint64(n), big.NewInt(int64(p.EgressGB)))
	q, m := new(big.Int).QuoRem(num, big.NewInt(1_000_000_000), new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() || q.Int64() > int64(money.MaxUSD) {
		return money.MaxUSD
	}
	return money.USD(q.Int64())
}

// Resources are what a sandbox holds for an interval.
type Resources struct {
	VCPUs    int
	MemoryMB int
	DiskGB   int
	Paused   bool
	// SnapshotBytes is snapshot storage held.
	SnapshotBytes int64
}

// Cost is what r costs for d, rounded up to the micro-dollar. Exact: the
// products are big integers, never floats.
func (p Prices) Cost(r Resources, d time.Duration) money.USD {
	if d <= 0 {
		return 0
	}
	vcpu, mem := p.VCPUHour, p.MemoryGiBHour
	if r.Paused {
		vcpu, mem = p.PausedVCPUHour, p.PausedMemoryGiBHour
	}
	// Per hour, in micro-dollars times 1024 (memory is priced per GiB and
	// reserved in MiB).
	kib := big.NewInt(1024)
	rate := new(big.Int).Mul(big.NewInt(int64(r.VCPUs)), new(big.Int).Mul(big.NewInt(int64(vcpu)), kib))
	rate.Add(rate, new(big.Int).Mul(big.NewInt(int64(r.MemoryMB)), big.NewInt(int64(mem))))
	rate.Add(rate, new(big.Int).Mul(big.NewInt(int64(r.DiskGB)), new(big.Int).Mul(big.NewInt(int64(p.DiskGBHour)), kib)))
	// Snapshot storage is per 10^9 bytes: everything over a common
	// denominator of an hour, 1024 and 10^9.
	giga := big.NewInt(1_000_000_000)
	rate.Mul(rate, giga)
	rate.Add(rate, new(big.Int).Mul(big.NewInt(r.SnapshotBytes), new(big.Int).Mul(big.NewInt(int64(p.SnapshotGBHour)), kib)))
	num := rate.Mul(rate, big.NewInt(int64(d)))
	den := new(big.Int).Mul(big.NewInt(int64(time.Hour)*1024), giga)
	q, m := new(big.Int).QuoRem(num, den, new(big.Int))
	if m.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() || q.Int64() > int64(money.MaxUSD) {
		return money.MaxUSD
	}
	return money.USD(q.Int64())
}
