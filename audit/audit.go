// Package audit is the append-only, hash-chained audit log. Every entry
// commits (SHA-256) to its own fields and to the hash of the entry before
// it; every CheckpointEvery entries, and when the log closes, the newest
// hash is signed with an ed25519 key kept in the data directory, so that
// rewriting the log needs the key as well as the database. Verify walks the
// chain and the checkpoints and names the first entry that was altered,
// removed or reordered.
//
// The library records (Record) every state-changing action and every read
// of sandbox contents, denied attempts included: who (the principal: a key
// ID, or "operator"), from where (the source address the API saw), what
// (the operationId and its target), the outcome and the request ID. No
// secret value, file content or command output goes in.
package audit

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Entry is one audit record.
type Entry = store.AuditEntry

// CheckpointEvery is how many entries a checkpoint signs at most.
const CheckpointEvery = 256

// Outcomes.
const (
	OK     = "ok"
	Denied = "denied"
	Failed = "error"
)

// Log appends to and verifies the audit log.
type Log struct {
	db  store.Store
	key ed25519.PrivateKey
	log *slog.Logger

	mu       sync.Mutex
	seq      int64
	last     string
	unsigned int
	// changed is closed (and replaced) at every append, for followers.
	changed chan struct{}
}

// NoticeTopic is the store notice of every append (store.Notify): a host
// that gets it from another calls Appended.
const NoticeTopic = "audit"

// appendIn chains e to the end of the log in tx (every host that shares
// the store is told once it commits).
func appendIn(ctx context.Context, tx store.Tx, e *Entry) error {
	last, err := tx.LastAudit(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
		e.Seq, e.Prev = 1, ""
	case err != nil:
		return err
	default:
		e.Seq, e.Prev = last.Seq+1, last.Hash
	}
	e.Hash = Hash(e)
	if err := tx.AppendAudit(ctx, e); err != nil {
		return err
	}
	return tx.Notify(ctx, NoticeTopic, "")
}

// Appended tells followers that another host appended (see NoticeTopic).
func (l *Log) Appended() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wake()
}

func (l *Log) wake() {
	if l.changed != nil {
		close(l.changed)
		l.changed = nil
	}
}

// Changed returns a channel closed at the next append.
func (l *Log) Changed() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.changed
}

// Open opens the log over db with the signing key in keyFile (created,
// mode 0600, if missing).
func Open(ctx context.Context, db store.Store, keyFile string, log *slog.Logger) (*Log, error) {
	key, err := loadKey(keyFile)
	if err != nil {
		return nil, err
	}
	l := &Log{db: db, key: key, log: log}
	last, err := db.LastAudit(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		l.seq, l.last = last.Seq, last.Hash
	}
	return l, nil
}

func loadKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, fmt.Errorf("audit: create key: %w", err)
		}
		_, err = f.Write(key.Seed())
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("audit: write key: %w", err)
		}
		return key, nil
	}
	if err != nil {
		return nil, fmt.Errorf("audit: read key: %w", err)
	}
	if len(b) != ed25519.SeedSize {
		return nil, fmt.Errorf("audit: %s: want a %d-byte ed25519 seed", path, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(b), nil
}

// PublicKey verifies the log's checkpoints.
func (l *Log) PublicKey() ed25519.PublicKey { return l.key.Public().(ed25519.PublicKey) }

// Hash is an entry's hash: SHA-256 of its JSON without the hash itself.
func Hash(e *Entry) string {
	c := *e
	c.Hash = ""
	b, _ := json.Marshal(&c)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

type requestKey struct{}

// WithRequestID records the request's ID for the entries made under ctx.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestKey{}, id)
}

// Record appends what the principal in ctx did: action on target, ending
// with err. The entry belongs to the key's account, or for the operator to
// accountID (the target's, if known). It logs a failure to append rather
// than failing the action that already happened.
func (l *Log) Record(ctx context.Context, action, accountID, target string, err error) {
	if l == nil {
		return
	}
	e := entry(ctx, action, accountID, target, err)
	if aerr := l.append(context.WithoutCancel(ctx), e); aerr != nil {
		l.log.Error("audit: cannot append", "action", action, "target", target, "err", aerr)
	}
}

// RecordIn is Record in the caller's transaction: the entry commits with
// what the transaction does, or neither does (an error here fails it).
func (l *Log) RecordIn(ctx context.Context, tx store.Tx, action, accountID, target string, err error) error {
	if l == nil {
		return nil
	}
	return appendIn(ctx, tx, entry(ctx, action, accountID, target, err))
}

// entry is what the principal in ctx did: action on target, ending with
// err.
func entry(ctx context.Context, action, accountID, target string, err error) *Entry {
	p := authz.From(ctx)
	e := &Entry{Time: time.Now().UTC(), AccountID: accountID, Principal: "operator", Action: action, Target: target, Outcome: OK}
	if !p.Operator {
		// A key's every act, a probe of another account included, is its
		// own account's record.
		e.Principal, e.AccountID = p.KeyID, p.AccountID
	}
	if a, ok := authz.Source(ctx); ok {
		e.Source = a.String()
	}
	e.RequestID, _ = ctx.Value(requestKey{}).(string)
	if err != nil {
		e.Outcome, e.Error = Failed, kindOf(err)
		if errors.Is(err, sandbox.ErrForbidden) || errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, sandbox.ErrUnauthenticated) {
			e.Outcome = Denied
		}
	}
	return e
}

// RecordPlaceholder records that code in a sandbox sent one of its
// placeholders where it is not swapped (to host): the act of the guest,
// not of an API caller, and refused.
func (l *Log) RecordPlaceholder(accountID, sandboxID, host string) {
	if l == nil {
		return
	}
	e := &Entry{Time: time.Now().UTC(), AccountID: accountID, Principal: "sandbox:" + sandboxID, Action: "usePlaceholder",
		Target: host, Outcome: Denied, Error: "forbidden"}
	if err := l.append(context.Background(), e); err != nil {
		l.log.Error("audit: cannot append", "action", e.Action, "err", err)
	}
}

// RecordURLAccess records an access decision of the ingress on a
// published URL: the act of whoever holds (or lacks) its credential, who
// ("token", "oidc", or "oidc:" and the ID token's subject).
func (l *Log) RecordURLAccess(u *sandbox.URL, who string, allowed bool) {
	if l == nil {
		return
	}
	e := &Entry{Time: time.Now().UTC(), AccountID: u.AccountID, Principal: "url:" + who, Action: "accessURL",
		Target: u.ID, Outcome: OK}
	if !allowed {
		e.Outcome, e.Error = Denied, "unauthenticated"
		if strings.Contains(who, ":") { // a valid credential the URL does not allow
			e.Error = "forbidden"
		}
	}
	if err := l.append(context.Background(), e); err != nil {
		l.log.Error("audit: cannot append", "action", e.Action, "err", err)
	}
}

// RecordBudget records what a budget did (it was reached, crossed a
// warning threshold, or acted on a sandbox): the act of the budget, not
// of an API caller.
func (l *Log) RecordBudget(accountID, budgetID, action, target string) {
	l.RecordEvent("budget:"+budgetID, accountID, action, target)
}

// RecordEvent records what happened on the engine's side, not by an API
// caller (a budget's act, a VM that stopped on its own): principal says
// who ("budget:ID", "engine"). Such entries are the events of
// /v1/events.
func (l *Log) RecordEvent(principal, accountID, action, target string) {
	if l == nil {
		return
	}
	e := &Entry{Time: time.Now().UTC(), AccountID: accountID, Principal: principal, Action: action,
		Target: target, Outcome: OK}
	if err := l.append(context.Background(), e); err != nil {
		l.log.Error("audit: cannot append", "action", e.Action, "err", err)
	}
}

// kindOf names an error's kind, never its message (which may quote
// request data).
func kindOf(err error) string {
	for _, k := range []struct {
		err  error
		name string
	}{
		{sandbox.ErrInvalid, "invalid"}, {sandbox.ErrNotFound, "not_found"}, {sandbox.ErrState, "conflict"},
		{sandbox.ErrExists, "conflict"}, {sandbox.ErrCapacity, "over_capacity"}, {sandbox.ErrTooLarge, "too_large"},
		{sandbox.ErrUnavailable, "unavailable"}, {sandbox.ErrTimeout, "timeout"}, {sandbox.ErrForbidden, "forbidden"},
		{sandbox.ErrRateLimited, "rate_limited"}, {sandbox.ErrUnauthenticated, "unauthorized"},
		{sandbox.ErrBudget, "budget_exceeded"},
	} {
		if errors.Is(err, k.err) {
			return k.name
		}
	}
	return "internal"
}

func (l *Log) append(ctx context.Context, e *Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	// The chain's end is read in the append's transaction: the hosts
	// that share a store append to one chain. Two that take the same
	// place conflict, and the loser goes again after the winner.
	for attempt := 1; ; attempt++ {
		err := l.db.Update(ctx, func(tx store.Tx) error { return appendIn(ctx, tx, e) })
		if errors.Is(err, store.ErrConflict) && attempt < 20 {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	l.seq, l.last = e.Seq, e.Hash
	l.wake()
	if l.unsigned++; l.unsigned >= CheckpointEvery {
		return l.checkpoint(ctx)
	}
	return nil
}

// Checkpoint signs the newest entry now.
func (l *Log) Checkpoint(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkpoint(ctx)
}

func (l *Log) checkpoint(ctx context.Context) error {
	if l.seq == 0 || l.unsigned == 0 {
		return nil
	}
	c := &store.AuditCheckpoint{Seq: l.seq, Hash: l.last, Time: time.Now().UTC()}
	c.Sig = ed25519.Sign(l.key, checkpointMsg(c.Seq, c.Hash))
	if err := l.db.PutAuditCheckpoint(ctx, c); err != nil {
		return err
	}
	l.unsigned = 0
	return nil
}

func checkpointMsg(seq int64, hash string) []byte {
	return []byte(fmt.Sprintf("harebox-audit-checkpoint %d %s", seq, hash))
}

// List returns entries that match f, oldest first: all of them for the
// operator, only its own account's for a key.
func (l *Log) List(ctx context.Context, f store.AuditFilter) ([]*Entry, error) {
	p := authz.From(ctx)
	if err := authz.Allowed(p, "listAudit"); err != nil {
		return nil, err
	}
	if !p.Operator {
		f.AccountID = p.AccountID
	}
	out, err := l.db.ListAudit(ctx, f)
	if out == nil {
		out = []*Entry{}
	}
	return out, err
}

// Verify checks the chain and the checkpoints (the operator only: it reads
// every account's entries).
func (l *Log) Verify(ctx context.Context) (*Report, error) {
	if err := authz.Allowed(authz.From(ctx), "verifyAudit"); err != nil {
		return nil, err
	}
	return Verify(ctx, l.db, l.PublicKey())
}

// MayReadKey says whether the principal in ctx may read the public key.
func (l *Log) MayReadKey(ctx context.Context) error {
	return authz.Allowed(authz.From(ctx), "getAuditKey")
}
