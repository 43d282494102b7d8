package clone

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"sync"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// The warm pool's setting (harebox pool). Each host keeps a pool of its
// own (its golden snapshots and idle members are its own), but what the
// pools keep is one setting of the deployment, in the store that the
// hosts share: set through any host, it reaches the others at once (a
// notice through the store), and each stops or restores members to
// match. While the deployment has none, each host keeps what its own
// hareboxd --pool says.

const (
	// PoolSettingName is the setting's name in the store.
	PoolSettingName = "pool"
	// PoolNoticeTopic is the notice that it changed.
	PoolNoticeTopic = "pool"
)

// PoolTx is what a change of the setting does in its transaction.
type PoolTx interface {
	PutSetting(ctx context.Context, name string, value json.RawMessage) error
	DeleteSetting(ctx context.Context, name string) error
	Notify(ctx context.Context, topic, payload string) error
}

// PoolStore is what PoolSettings needs of the store
// (store.Narrow(db, func(tx store.Tx) PoolTx { return tx })).
type PoolStore interface {
	GetSetting(ctx context.Context, name string) (json.RawMessage, error)
	Update(ctx context.Context, fn func(tx PoolTx) error) error
}

// PoolSettingsOptions are PoolSettings' parts.
type PoolSettingsOptions struct {
	Store PoolStore
	// Pool is this host's pool, which the setting is applied to.
	Pool *Service
	// Local is this host's own setting (hareboxd --pool, checked by
	// ParsePool), kept while the deployment has none.
	Local map[string]int
	// Host names this host in answers.
	Host  string
	Audit Audit
	Now   func() time.Time
	Log   *slog.Logger
}

// PoolSettings reads, changes and applies the pool's setting.
type PoolSettings struct {
	o PoolSettingsOptions
	// mu orders Load's read and apply; cur is what was applied last.
	mu  sync.Mutex
	cur model.Pool
}

// poolSetting is the setting as the store keeps it.
type poolSetting struct {
	Pool  map[string]int `json:"pool"`
	SetAt time.Time      `json:"set_at"`
}

// NewPoolSettings returns the setting's service; Load applies it.
func NewPoolSettings(o PoolSettingsOptions) *PoolSettings {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return &PoolSettings{o: o, cur: model.Pool{Pool: maps.Clone(o.Local), Source: model.PoolFromHost}}
}

// Get returns the pool as this host keeps it (the operator only).
func (p *PoolSettings) Get(ctx context.Context) (*model.Pool, error) {
	if err := authz.Allowed(authz.From(ctx), "getPool"); err != nil {
		return nil, err
	}
	return p.view(), nil
}

// Set makes pool (IMAGE:PRESET -> count) the pool of every host of the
// deployment (the operator only); this host applies it before Set
// returns, the others when they get the notice. An image this host does
// not have is refused (a misspelling would keep nothing).
func (p *PoolSettings) Set(ctx context.Context, pool map[string]int) (_ *model.Pool, err error) {
	defer func() { p.o.Audit.Record(ctx, "setPool", "", PoolSettingName, err) }()
	if err := authz.Allowed(authz.From(ctx), "setPool"); err != nil {
		return nil, err
	}
	entries, err := ParsePool(pool)
	if err != nil {
		return nil, err
	}
	for _, pe := range entries {
		if _, err := p.o.Pool.o.Images.Lookup(pe.Image); err != nil {
			return nil, sandbox.Errorf(sandbox.ErrInvalid, "pool", "no image %q on host %s (harebox image list): %v", pe.Image, p.o.Host, err)
		}
	}
	if pool == nil {
		pool = map[string]int{}
	}
	v, err := json.Marshal(poolSetting{Pool: pool, SetAt: p.o.Now().UTC()})
	if err != nil {
		return nil, err
	}
	return p.save(ctx, func(tx PoolTx) error { return tx.PutSetting(ctx, PoolSettingName, v) })
}

// Reset removes the deployment's setting (the operator only): each host
// keeps what its own hareboxd --pool says again.
func (p *PoolSettings) Reset(ctx context.Context) (_ *model.Pool, err error) {
	defer func() { p.o.Audit.Record(ctx, "resetPool", "", PoolSettingName, err) }()
	if err := authz.Allowed(authz.From(ctx), "resetPool"); err != nil {
		return nil, err
	}
	return p.save(ctx, func(tx PoolTx) error {
		if err := tx.DeleteSetting(ctx, PoolSettingName); err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		return nil
	})
}

// save makes change in one transaction with the notice that tells every
// host, then applies the setting here and returns the pool as this host
// keeps it.
func (p *PoolSettings) save(ctx context.Context, change func(tx PoolTx) error) (*model.Pool, error) {
	if err := p.o.Store.Update(ctx, func(tx PoolTx) error {
		if err := change(tx); err != nil {
			return err
		}
		return tx.Notify(ctx, PoolNoticeTopic, "")
	}); err != nil {
		return nil, err
	}
	p.Load(ctx)
	return p.view(), nil
}

// Load applies the setting as the store has it now: at start, and on its
// notice (or on a notice missed). A setting that cannot be read leaves the
// pool as it is.
func (p *PoolSettings) Load(ctx context.Context) {
	p.mu.Lock()
	defer p.mu.Unlock()
	next := model.Pool{Pool: maps.Clone(p.o.Local), Source: model.PoolFromHost}
	v, err := p.o.Store.GetSetting(ctx, PoolSettingName)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		p.o.Log.Warn("pool: cannot read the deployment's setting; the pool stays as it is", "err", err)
		return
	default:
		var ps poolSetting
		if err := json.Unmarshal(v, &ps); err != nil {
			p.o.Log.Warn("pool: the deployment's setting does not decode; the pool stays as it is", "err", err)
			return
		}
		setAt := ps.SetAt
		next = model.Pool{Pool: ps.Pool, Source: model.PoolFromDeployment, SetAt: &setAt}
	}
	entries, err := ParsePool(next.Pool)
	if err != nil {
		p.o.Log.Warn("pool: the deployment's setting is not one this host can keep; the pool stays as it is", "err", err)
		return
	}
	if next.Pool == nil {
		next.Pool = map[string]int{}
	}
	if next.Source != p.cur.Source || !maps.Equal(next.Pool, p.cur.Pool) {
		p.o.Log.Info("pool: keeping", "pool", next.Pool, "source", next.Source)
	}
	p.cur = next
	p.o.Pool.SetPool(entries)
}

// Specs is what the pool keeps now, "IMAGE:PRESET" -> count.
func (p *PoolSettings) Specs() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.cur.Pool)
}

func (p *PoolSettings) view() *model.Pool {
	p.mu.Lock()
	out := p.cur
	p.mu.Unlock()
	out.Pool = maps.Clone(out.Pool)
	if out.Pool == nil {
		out.Pool = map[string]int{}
	}
	out.Host, out.Kept, out.Idle = p.o.Host, p.o.Pool.o.Golden, p.o.Pool.Idle()
	return &out
}
