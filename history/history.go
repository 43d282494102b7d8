// Package history keeps a sandbox's command history: each finished
// command, sealed under the sandbox's data key, its output bounded, kept as
// the account's retention allows, and erased with the sandbox.
package history

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// OutputBytes bounds the output kept in history, per stream and command
// (the rest is dropped and flagged).
const OutputBytes = 64 << 10

// label binds sealed history entries to what they are.
const label = "history"

// Store is what history needs of the store: the entries' index and the
// accounts' retention.
type Store interface {
	GetAccount(ctx context.Context, id string) (*store.Account, error)
	ListAccounts(ctx context.Context) ([]*store.Account, error)
	PutCommand(ctx context.Context, c *store.CommandRow) error
	ListCommands(ctx context.Context, sandboxID string, limit int) ([]*store.CommandRow, error)
	OldCommands(ctx context.Context, accountID string, before time.Time, withOutput bool) ([]*store.CommandRow, error)
	DeleteCommand(ctx context.Context, id string) error
	DeleteCommands(ctx context.Context, sandboxID string) error
}

// Secrets is what history needs of the secret store, where the sealed
// entries are kept.
type Secrets interface {
	Put(ctx context.Context, scope, name string, value []byte) error
	Get(ctx context.Context, scope, name string) ([]byte, error)
	Delete(ctx context.Context, scope, name string) error
	DeleteScope(ctx context.Context, scope string) error
}

// Options are a Service's parts.
type Options struct {
	Store   Store
	Secrets Secrets
	// Key returns a sandbox's data key; nil for a sandbox without one (its
	// entries are sealed by the secret store's master key alone).
	Key func(ctx context.Context, sandboxID string) ([]byte, error)
	Now func() time.Time
	Log *slog.Logger
}

// Service keeps the command history of every sandbox. It is safe for
// concurrent use.
type Service struct{ o Options }

// New returns a Service over o.
func New(o Options) *Service { return &Service{o: o} }

// Sandbox is what Record needs of a sandbox.
type Sandbox struct {
	ID, AccountID string
	// Monitoring off keeps no history.
	Monitoring bool
	// Key is its data key (nil: none).
	Key []byte
	// Deleting reports whether a delete has begun (it erases the history
	// after this reports true).
	Deleting func() bool
}

// A sandbox's history entries are sealed in the secret store under its
// own scope: they hold commands and output, which are the sandbox's data,
// and go when it is deleted.
func scope(sandboxID string) string { return "history/" + sandboxID }

// Record keeps a finished command in the sandbox's history, as the
// account's retention and the sandbox's monitoring allow. A failure to
// keep it is logged: the command already ran.
func (s *Service) Record(ctx context.Context, b Sandbox, kind string, r *sandbox.ExecRequest, started time.Time, res *sandbox.ExecResult) {
	if !b.Monitoring || res == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	acc, err := s.o.Store.GetAccount(ctx, b.AccountID)
	if err != nil {
		return
	}
	ret := acc.Retention
	if ret.HistoryDays != nil && *ret.HistoryDays == 0 {
		return
	}
	c := sandbox.Command{
		ID: "cmd_" + strings.TrimPrefix(sandbox.NewID(), sandbox.IDPrefix), SandboxID: b.ID, Kind: kind,
		Cmd: r.Cmd, Argv: r.Argv, User: r.User, Cwd: r.Cwd, StartedAt: started.UTC(), EndedAt: s.o.Now().UTC(),
	}
	out := *res
	out.Stdout, out.StdoutTruncated = bound(out.Stdout, out.StdoutTruncated)
	out.Stderr, out.StderrTruncated = bound(out.Stderr, out.StderrTruncated)
	c.Result = &out
	if ret.OutputDays != nil && *ret.OutputDays == 0 {
		dropOutput(&c)
	}
	if b.Deleting() {
		return
	}
	if err := s.put(ctx, b.AccountID, b.Key, &c); err != nil {
		s.o.Log.Warn("command history: cannot keep an entry", "id", b.ID, "err", err)
	}
	// A delete that began meanwhile may have erased the history before
	// this entry: it goes too (a delete closes deleting before it erases,
	// so one that begins after this check erases the entry itself).
	if b.Deleting() {
		if err := s.Erase(ctx, b.ID); err != nil {
			s.o.Log.Warn("command history: cannot erase an entry kept during a delete", "id", b.ID, "err", err)
		}
	}
}

func bound(s string, truncated bool) (string, bool) {
	if len(s) > OutputBytes {
		return s[:OutputBytes], true
	}
	return s, truncated
}

func dropOutput(c *sandbox.Command) {
	if c.Result != nil {
		c.Result.Stdout, c.Result.Stderr = "", ""
		c.Result.StdoutTruncated, c.Result.StderrTruncated = false, false
	}
	c.OutputPurged = true
}

// put seals an entry (under the sandbox's data key) and indexes it.
func (s *Service) put(ctx context.Context, accountID string, key []byte, c *sandbox.Command) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if b, err = sandboxkeys.Seal(key, label, b); err != nil {
		return err
	}
	if err := s.o.Secrets.Put(ctx, scope(c.SandboxID), c.ID, b); err != nil {
		return err
	}
	return s.o.Store.PutCommand(ctx, &store.CommandRow{ID: c.ID, SandboxID: c.SandboxID, AccountID: accountID, StartedAt: c.StartedAt, OutputPurged: c.OutputPurged})
}

// List returns a sandbox's command history, oldest first: its newest
// limit entries (0: all, up to 10000). The caller has authorized it.
func (s *Service) List(ctx context.Context, sandboxID string, limit int) ([]sandbox.Command, error) {
	rows, err := s.o.Store.ListCommands(ctx, sandboxID, limit)
	if err != nil {
		return nil, err
	}
	key, err := s.o.Key(ctx, sandboxID)
	if err != nil {
		return nil, err
	}
	out := []sandbox.Command{}
	for _, row := range rows {
		if c, err := s.get(ctx, key, row); err == nil {
			out = append(out, *c)
		} // else purged in between
	}
	return out, nil
}

// get reads one sealed entry.
func (s *Service) get(ctx context.Context, key []byte, row *store.CommandRow) (*sandbox.Command, error) {
	raw, err := s.o.Secrets.Get(ctx, scope(row.SandboxID), row.ID)
	if err != nil {
		return nil, err
	}
	if raw, err = sandboxkeys.Open(key, label, raw); err != nil {
		return nil, err
	}
	var c sandbox.Command
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// Erase removes a sandbox's history (delete).
func (s *Service) Erase(ctx context.Context, sandboxID string) error {
	return errors.Join(s.o.Secrets.DeleteScope(ctx, scope(sandboxID)), s.o.Store.DeleteCommands(ctx, sandboxID))
}

// Purge applies every account's retention now: entries older than
// history_days go, output older than output_days is dropped.
func (s *Service) Purge(ctx context.Context) {
	accs, err := s.o.Store.ListAccounts(ctx)
	if err != nil {
		return
	}
	now := s.o.Now()
	for _, a := range accs {
		ret := a.Retention
		if d := ret.HistoryDays; d != nil {
			rows, _ := s.o.Store.OldCommands(ctx, a.ID, now.Add(-time.Duration(*d)*24*time.Hour), false)
			for _, row := range rows {
				s.o.Secrets.Delete(ctx, scope(row.SandboxID), row.ID)
				s.o.Store.DeleteCommand(ctx, row.ID)
			}
		}
		if d := ret.OutputDays; d != nil {
			rows, _ := s.o.Store.OldCommands(ctx, a.ID, now.Add(-time.Duration(*d)*24*time.Hour), true)
			for _, row := range rows {
				key, err := s.o.Key(ctx, row.SandboxID)
				if err != nil {
					continue
				}
				c, err := s.get(ctx, key, row)
				if err != nil {
					continue
				}
				dropOutput(c)
				if err := s.put(ctx, a.ID, key, c); err != nil {
					s.o.Log.Warn("command history: cannot drop output", "id", row.SandboxID, "err", err)
				}
			}
		}
	}
}

// Writers tees a streaming exec's output into bounded buffers for its
// history entry.
func Writers(stdout, stderr io.Writer) (o, e *agentclient.CapBuffer, wo, we io.Writer) {
	o, e = agentclient.NewCapBuffer(OutputBytes), agentclient.NewCapBuffer(OutputBytes)
	return o, e, tee{stdout, o}, tee{stderr, e}
}

// tee writes to w and keeps a copy in c; a nil w only keeps.
type tee struct {
	w io.Writer
	c *agentclient.CapBuffer
}

func (t tee) Write(b []byte) (int, error) {
	t.c.Write(b)
	if t.w == nil {
		return len(b), nil
	}
	return t.w.Write(b)
}
