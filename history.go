package harebox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"time"

	agentclient "github.com/harebox/harebox/agent/client"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// HistoryOutputBytes bounds the output kept in history, per stream and
// command (the rest is dropped and flagged).
const HistoryOutputBytes = 64 << 10

// A sandbox's history entries are sealed in the secret store under its
// own scope: they hold commands and output, which are the sandbox's data,
// and go when it is deleted.
func historyScope(sandboxID string) string { return "history/" + sandboxID }

// remember keeps a finished command in the sandbox's history, as the
// account's retention and the sandbox's monitoring allow. A failure to
// keep it is logged: the command already ran.
func (e *Engine) remember(ctx context.Context, b *box, kind string, r *sandbox.ExecRequest, started time.Time, res *sandbox.ExecResult) {
	if !b.rec.Monitoring || res == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	acc, err := e.store.GetAccount(ctx, b.rec.AccountID)
	if err != nil {
		return
	}
	ret := acc.Retention
	if ret.HistoryDays != nil && *ret.HistoryDays == 0 {
		return
	}
	c := sandbox.Command{
		ID: "cmd_" + strings.TrimPrefix(sandbox.NewID(), sandbox.IDPrefix), SandboxID: b.rec.ID, Kind: kind,
		Cmd: r.Cmd, Argv: r.Argv, User: r.User, Cwd: r.Cwd, StartedAt: started.UTC(), EndedAt: e.opts.Now().UTC(),
	}
	out := *res
	out.Stdout, out.StdoutTruncated = bound(out.Stdout, out.StdoutTruncated)
	out.Stderr, out.StderrTruncated = bound(out.Stderr, out.StderrTruncated)
	c.Result = &out
	if ret.OutputDays != nil && *ret.OutputDays == 0 {
		dropOutput(&c)
	}
	if b.isDeleting() {
		return
	}
	if err := e.putCommand(ctx, b.rec.AccountID, b.key, &c); err != nil {
		e.log.Warn("command history: cannot keep an entry", "id", b.rec.ID, "err", err)
	}
	// A delete that began meanwhile may have erased the history before
	// this entry: it goes too (a delete closes deleting before it erases,
	// so one that begins after this check erases the entry itself).
	if b.isDeleting() {
		if err := e.eraseHistory(ctx, b.rec.ID); err != nil {
			e.log.Warn("command history: cannot erase an entry kept during a delete", "id", b.rec.ID, "err", err)
		}
	}
}

func bound(s string, truncated bool) (string, bool) {
	if len(s) > HistoryOutputBytes {
		return s[:HistoryOutputBytes], true
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

// putCommand seals an entry (under the sandbox's data key) and indexes it.
func (e *Engine) putCommand(ctx context.Context, accountID string, key []byte, c *sandbox.Command) error {
	b, err := json.Marshal(c)
	if err != nil {
		return err
	}
	if b, err = seal(key, historyLabel, b); err != nil {
		return err
	}
	if err := e.sec.Put(ctx, historyScope(c.SandboxID), c.ID, b); err != nil {
		return err
	}
	return e.store.PutCommand(ctx, &store.CommandRow{ID: c.ID, SandboxID: c.SandboxID, AccountID: accountID, StartedAt: c.StartedAt, OutputPurged: c.OutputPurged})
}

// Commands returns a sandbox's command history, oldest first: its newest
// limit entries (0: all, up to 10000).
func (e *Engine) Commands(ctx context.Context, id string, limit int) (_ []sandbox.Command, err error) {
	defer e.audited(ctx, "listCommands", id, &err)
	if err := e.check(ctx, "listCommands", id); err != nil {
		return nil, err
	}
	if _, err := e.record(ctx, id); err != nil && e.live(id) == nil {
		return nil, err
	}
	rows, err := e.store.ListCommands(ctx, id, limit)
	if err != nil {
		return nil, err
	}
	key, err := e.dataKey(ctx, id)
	if err != nil {
		return nil, err
	}
	out := []sandbox.Command{}
	for _, row := range rows {
		if c, err := e.getCommand(ctx, key, row); err == nil {
			out = append(out, *c)
		} // else purged in between
	}
	return out, nil
}

// historyLabel binds sealed history entries to what they are.
const historyLabel = "history"

// getCommand reads one sealed entry.
func (e *Engine) getCommand(ctx context.Context, key []byte, row *store.CommandRow) (*sandbox.Command, error) {
	raw, err := e.sec.Get(ctx, historyScope(row.SandboxID), row.ID)
	if err != nil {
		return nil, err
	}
	if raw, err = open(key, historyLabel, raw); err != nil {
		return nil, err
	}
	var c sandbox.Command
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// eraseHistory removes a sandbox's history (delete).
func (e *Engine) eraseHistory(ctx context.Context, id string) error {
	return errors.Join(e.sec.DeleteScope(ctx, historyScope(id)), e.store.DeleteCommands(ctx, id))
}

// purgeHistory applies every account's retention now: entries (and
// monitoring samples) older than history_days go, output older than
// output_days is dropped.
func (e *Engine) purgeHistory(ctx context.Context) {
	accs, err := e.store.ListAccounts(ctx)
	if err != nil {
		return
	}
	now := e.opts.Now()
	for _, a := range accs {
		ret := a.Retention
		if d := ret.HistoryDays; d != nil {
			// Monitoring samples are kept as long as history.
			if err := e.store.PurgeMetrics(ctx, a.ID, now.Add(-time.Duration(*d)*24*time.Hour)); err != nil {
				e.log.Warn("monitoring: cannot purge samples", "account", a.ID, "err", err)
			}
			rows, _ := e.store.OldCommands(ctx, a.ID, now.Add(-time.Duration(*d)*24*time.Hour), false)
			for _, row := range rows {
				e.sec.Delete(ctx, historyScope(row.SandboxID), row.ID)
				e.store.DeleteCommand(ctx, row.ID)
			}
		}
		if d := ret.OutputDays; d != nil {
			rows, _ := e.store.OldCommands(ctx, a.ID, now.Add(-time.Duration(*d)*24*time.Hour), true)
			for _, row := range rows {
				key, err := e.dataKey(ctx, row.SandboxID)
				if err != nil {
					continue
				}
				c, err := e.getCommand(ctx, key, row)
				if err != nil {
					continue
				}
				dropOutput(c)
				if err := e.putCommand(ctx, a.ID, key, c); err != nil {
					e.log.Warn("command history: cannot drop output", "id", row.SandboxID, "err", err)
				}
			}
		}
	}
}

// historyWriters tees a streaming exec's output into bounded buffers for
// its history entry.
func historyWriters(stdout, stderr io.Writer) (o, e *agentclient.CapBuffer, wo, we io.Writer) {
	o, e = agentclient.NewCapBuffer(HistoryOutputBytes), agentclient.NewCapBuffer(HistoryOutputBytes)
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
