package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/harebox/harebox/sandbox"
)

// Host is one hareboxd of a deployment whose hosts share the store. It
// holds its row by renewing a lease; a host whose lease lapsed is down.
type Host struct {
	Name string `json:"name"`
	Site string `json:"site"`
	// Country is its site's (ISO 3166-1 alpha-2), if known.
	Country string `json:"country,omitempty"`
	// Address is its internal endpoint (https://HOST:PORT), where the
	// other hosts forward the requests for its sandboxes.
	Address  string            `json:"address,omitempty"`
	Capacity sandbox.Resources `json:"capacity"`
	// Used is what its sandboxes reserve, as of its last renewal.
	Used sandbox.Resources `json:"used"`
	Up   bool              `json:"up"`
	// Draining: no new sandbox goes there (harebox hosts drain; undrain
	// clears it).
	Draining   bool      `json:"draining,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	RenewedAt  time.Time `json:"renewed_at"`
	LeaseUntil time.Time `json:"lease_until"`
	// Mesh is its end of the mesh's tunnels, if it has one.
	Mesh *HostMesh `json:"mesh,omitempty"`
}

// HostMesh is a host's end of the mesh's tunnels as the other hosts find
// it (its public key and the underlay address its tunnels arrive on), and
// its tunnels as it last reported them.
type HostMesh struct {
	PublicKey  string    `json:"public_key"`
	Endpoint   string    `json:"endpoint"`
	Tunnels    []Tunnel  `json:"tunnels,omitempty"`
	ReportedAt time.Time `json:"reported_at,omitzero"`
}

// Tunnel is one host's tunnel to another.
type Tunnel struct {
	Host          string    `json:"host"`
	PublicKey     string    `json:"public_key"`
	Endpoint      string    `json:"endpoint,omitempty"`
	LastHandshake time.Time `json:"last_handshake,omitzero"`
	RxBytes       uint64    `json:"rx_bytes"`
	TxBytes       uint64    `json:"tx_bytes"`
}

// PutHost implements Tx.
func (s *DB) PutHost(ctx context.Context, h *Host) error {
	return s.put(ctx, "hosts", []string{"name", "lease_until"}, []any{h.Name, h.LeaseUntil.UnixNano()}, h)
}

// GetHost implements Tx.
func (s *DB) GetHost(ctx context.Context, name string) (*Host, error) {
	return get[Host](ctx, s, `SELECT record FROM hosts WHERE name = ?`, name)
}

// DeleteHost implements Tx.
func (s *DB) DeleteHost(ctx context.Context, name string) error {
	return s.delBy(ctx, "hosts", "name", name)
}

// ListHosts implements Tx.
func (s *DB) ListHosts(ctx context.Context) ([]*Host, error) {
	return list[Host](ctx, s, `SELECT record FROM hosts ORDER BY name`)
}

// SandboxesOn implements Tx.
func (s *DB) SandboxesOn(ctx context.Context, host string, states ...sandbox.State) ([]*Sandbox, error) {
	q, args := `SELECT record FROM sandboxes WHERE host = ?`, []any{host}
	if len(states) > 0 {
		q += ` AND state IN (?`
		for i := 1; i < len(states); i++ {
			q += `, ?`
		}
		q += `)`
		for _, st := range states {
			args = append(args, string(st))
		}
	}
	return list[Sandbox](ctx, s, q+` ORDER BY created_at, id`, args...)
}

// TakeToken implements Store: one atomic statement, so hosts that share
// the database take from one bucket without a transaction to retry. The
// bucket fills at perSecond up to burst; a clock that went back adds
// nothing.
func (s *DB) TakeToken(ctx context.Context, key string, perSecond float64, burst int, now time.Time) (time.Duration, error) {
	least, greatest := "LEAST", "GREATEST"
	if !s.pg {
		least, greatest = "MIN", "MAX"
	}
	refilled := least + `(excluded.burst, key_buckets.tokens + ` + greatest + `(excluded.updated_ns - key_buckets.updated_ns, 0) * excluded.rate / 1e9)`
	q := `INSERT INTO key_buckets (key_id, tokens, updated_ns, rate, burst) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT (key_id) DO UPDATE SET tokens = ` + refilled + ` - 1,
			updated_ns = ` + greatest + `(excluded.updated_ns, key_buckets.updated_ns), rate = excluded.rate, burst = excluded.burst
		WHERE ` + refilled + ` >= 1
		RETURNING tokens`
	var left float64
	err := s.q.QueryRowContext(ctx, q, key, float64(burst-1), now.UnixNano(), perSecond, float64(burst)).Scan(&left)
	if err == nil {
		return 0, nil
	}
	if !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("store: take a token: %w", err)
	}
	// Spent: how long until it holds one again.
	var tokens float64
	var updated int64
	if err := s.q.QueryRowContext(ctx, `SELECT tokens, updated_ns FROM key_buckets WHERE key_id = ?`, key).Scan(&tokens, &updated); err != nil {
		return 0, fmt.Errorf("store: take a token: %w", err)
	}
	have := min(float64(burst), tokens+float64(max(now.UnixNano()-updated, 0))*perSecond/1e9)
	return time.Duration((1 - have) / perSecond * float64(time.Second)), nil
}
