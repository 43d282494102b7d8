// Package audit is the append-only, hash-chained audit log. Every entry
// commits (SHA-256) to its own fields and to the hash of the entry before
// it; every CheckpointEvery entries, at most a CheckpointInterval after
// an entry, and when the log closes, the newest hash is signed with an
// ed25519 key kept in the data directory, so that rewriting the log needs
// the key as well as the database. Each checkpoint is also kept by an
// Anchor outside the database, so that cutting the tail of the log with
// its checkpoints shows too. Verify walks the chain, the checkpoints and
// the anchor, checks every row's columns against the record the chain
// hashes, and names the first entry that was altered, removed or
// reordered; a read (List, Read) refuses a row it finds altered.
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
	"github.com/harebox/harebox/model"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// Entry is one audit record.
type Entry = store.AuditEntry

// CheckpointEvery is how many entries a checkpoint signs at most.
const CheckpointEvery = 256

// CheckpointInterval is how long an entry waits for its checkpoint at
// most, by default: what a crash (kill -9) leaves unanchored is at most
// this much time, or CheckpointEvery entries, of the log.
const CheckpointInterval = 30 * time.Second

// Outcomes.
const (
	OK     = "ok"
	Denied = "denied"
	Failed = "error"
)

// Options configure Open.
type Options struct {
	// KeyFile holds the signing key (created, mode 0600, if missing).
	KeyFile string
	Log     *slog.Logger
	// Anchor also keeps every checkpoint; default None.
	Anchor Anchor
	// Interval is how long an entry waits for its checkpoint at most;
	// default CheckpointInterval.
	Interval time.Duration
}

// Tx is what appending needs of a store transaction.
type Tx interface {
	AppendAudit(ctx context.Context, e *store.AuditEntry) error
	LastAudit(ctx context.Context) (*store.AuditEntry, error)
	Notify(ctx context.Context, topic, payload string) error
}

// Reader is what reading and verifying the log needs of the store.
type Reader interface {
	LastAudit(ctx context.Context) (*store.AuditEntry, error)
	ListAudit(ctx context.Context, f store.AuditFilter) ([]*store.AuditEntry, error)
	ListAuditCheckpoints(ctx context.Context) ([]*store.AuditCheckpoint, error)
}

// Store is what the log needs of the store: appends in transactions over
// Tx, its checkpoints, and reads.
type Store interface {
	Reader
	Update(ctx context.Context, fn func(tx Tx) error) error
	PutAuditCheckpoint(ctx context.Context, c *store.AuditCheckpoint) error
}

// Log appends to and verifies the audit log.
type Log struct {
	db       Store
	key      ed25519.PrivateKey
	log      *slog.Logger
	anchor   Anchor
	interval time.Duration

	mu       sync.Mutex
	seq      int64
	last     string
	unsigned int
	// tmu guards the time-bound checkpoint (taken after mu, never
	// before: RecordIn arms it inside a transaction, without mu).
	tmu    sync.Mutex
	timer  *time.Timer // while a checkpoint is due
	closed bool
	// changed is closed (and replaced) at every append, for followers.
	changed chan struct{}
}

// NoticeTopic is the store notice of every append (store.Notify): a host
// that gets it from another calls Appended.
const NoticeTopic = "audit"

// appendIn chains e to the end of the log in tx (every host that shares
// the store is told once it commits).
func appendIn(ctx context.Context, tx Tx, e *Entry) error {
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

// Open opens the log over db. Close signs the last entries.
func Open(ctx context.Context, db store.Store, opts Options) (*Log, error) {
	key, err := loadKey(opts.KeyFile)
	if err != nil {
		return nil, err
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.Anchor == nil {
		opts.Anchor = None
	}
	if opts.Interval <= 0 {
		opts.Interval = CheckpointInterval
	}
	l := &Log{db: store.Narrow(db, func(tx store.Tx) Tx { return tx }), key: key, log: opts.Log, anchor: opts.Anchor, interval: opts.Interval}
	last, err := db.LastAudit(ctx)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return nil, err
	default:
		l.seq, l.last = last.Seq, last.Hash
	}
	// A log cut back behind its anchor is said at once (verify says it
	// too, and where).
	if cps, err := l.anchor.Checkpoints(ctx); err != nil {
		l.log.Error("audit: cannot read the anchor", "anchor", l.anchor, "err", err)
	} else if n := len(cps); n > 0 && cps[n-1].Seq > l.seq {
		l.log.Error("audit: the log ends before its anchor says it reached: entries were removed (run harebox audit verify)",
			"anchor", l.anchor, "anchored", cps[n-1].Seq, "last", l.seq)
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
func (l *Log) RecordIn(ctx context.Context, tx Tx, action, accountID, target string, err error) error {
	if l == nil {
		return nil
	}
	if err := appendIn(ctx, tx, entry(ctx, action, accountID, target, err)); err != nil {
		return err
	}
	l.arm() // (the checkpoint finds the entry in the database, if it commits)
	return nil
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
func kindOf(err error) string { return model.Code(err) }

func (l *Log) append(ctx context.Context, e *Entry) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	// The chain's end is read in the append's transaction: the hosts
	// that share a store append to one chain. Two that take the same
	// place conflict, and the loser goes again after the winner.
	for attempt := 1; ; attempt++ {
		err := l.db.Update(ctx, func(tx Tx) error { return appendIn(ctx, tx, e) })
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
		// The entry is in; a checkpoint that fails is tried again at
		// the next append.
		if err := l.checkpoint(ctx); err != nil {
			l.log.Error("audit: cannot sign the last entries", "err", err)
		}
		return nil
	}
	l.arm()
	return nil
}

// arm makes a checkpoint due in the interval, unless one is already.
func (l *Log) arm() {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	if l.timer == nil && !l.closed {
		l.timer = time.AfterFunc(l.interval, l.due)
	}
}

// disarm stops the due checkpoint (one was just made).
func (l *Log) disarm() {
	l.tmu.Lock()
	defer l.tmu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}

// due makes the checkpoint an entry waited for for the interval.
func (l *Log) due() {
	l.tmu.Lock()
	l.timer = nil
	l.tmu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	// (Looked at once mu is held: Close may have signed, and the store
	// closed, while this waited.)
	l.tmu.Lock()
	closed := l.closed
	l.tmu.Unlock()
	if closed {
		return
	}
	if err := l.checkpoint(context.Background()); err != nil {
		l.log.Error("audit: cannot sign the last entries", "err", err)
	}
}

// Checkpoint signs the newest entry now.
func (l *Log) Checkpoint(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkpoint(ctx)
}

// Close signs the last entries and stops the time-bound checkpoints
// (entries appended later wait for the next Open's log to sign them). It
// leaves the store and the anchor open: they are the caller's.
func (l *Log) Close(ctx context.Context) error {
	l.tmu.Lock()
	l.closed = true
	l.tmu.Unlock()
	l.disarm()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.checkpoint(ctx)
}

// checkpoint signs the newest entry, in the database and in the anchor.
// If the anchor fails, the next append (or due time) signs again.
func (l *Log) checkpoint(ctx context.Context) error {
	l.advance(ctx)
	if l.seq == 0 || l.unsigned == 0 {
		return nil
	}
	c := &store.AuditCheckpoint{Seq: l.seq, Hash: l.last, Time: time.Now().UTC()}
	c.Sig = ed25519.Sign(l.key, checkpointMsg(c.Seq, c.Hash))
	if err := l.db.PutAuditCheckpoint(ctx, c); err != nil {
		return fmt.Errorf("audit: checkpoint %d: %w", c.Seq, err)
	}
	if err := l.anchor.Put(ctx, c); err != nil {
		return fmt.Errorf("audit: anchor checkpoint %d: %w", c.Seq, err)
	}
	l.unsigned = 0
	l.disarm()
	return nil
}

// advance moves the end this log signs to the database's, over the
// entries appended since that it did not append itself (RecordIn's, and
// other hosts'), as far as they chain from the end it knows: a tail
// rewritten in the database meanwhile is not signed.
func (l *Log) advance(ctx context.Context) {
	for {
		page, err := l.db.ListAudit(ctx, store.AuditFilter{After: l.seq, Limit: 1000})
		if err != nil {
			l.log.Error("audit: cannot read the log's end", "err", err)
			return
		}
		for _, e := range page {
			if e.Seq != l.seq+1 || e.Prev != l.last || len(e.Mismatch) > 0 || Hash(e) != e.Hash {
				l.log.Error("audit: the log's end does not chain from the last entry this host knows: not signed (run harebox audit verify)",
					"seq", e.Seq, "known", l.seq)
				return
			}
			l.seq, l.last = e.Seq, e.Hash
			l.unsigned++
		}
		if len(page) < 1000 {
			return
		}
	}
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
	out, err := l.Read(ctx, f)
	if out == nil {
		out = []*Entry{}
	}
	return out, err
}

// ErrAltered is what a read returns when an entry it met was altered in
// the database: its hash does not match its record, or a column that
// filters match disagrees with the record (which would move the entry out
// of, or into, the view). Verify says which entries, and how.
var ErrAltered = errors.New("audit: the log was altered in the database (harebox audit verify says where)")

// Read returns the entries that match f, oldest first, with no check of
// who asks (the caller's), each checked against the record the chain
// hashes.
func (l *Log) Read(ctx context.Context, f store.AuditFilter) ([]*Entry, error) {
	out, err := l.db.ListAudit(ctx, f)
	if err != nil {
		return nil, err
	}
	for _, e := range out {
		if len(e.Mismatch) > 0 || Hash(e) != e.Hash {
			l.log.Error("audit: an altered entry refused", "seq", e.Seq, "columns", e.Mismatch)
			return nil, fmt.Errorf("entry %d: %w", e.Seq, ErrAltered)
		}
	}
	return out, nil
}

// Verify checks the chain and the checkpoints (the operator only: it reads
// every account's entries).
func (l *Log) Verify(ctx context.Context) (*Report, error) {
	if err := authz.Allowed(authz.From(ctx), "verifyAudit"); err != nil {
		return nil, err
	}
	return VerifyAnchored(ctx, l.db, l.PublicKey(), l.anchor)
}

// MayReadKey says whether the principal in ctx may read the public key.
func (l *Log) MayReadKey(ctx context.Context) error {
	return authz.Allowed(authz.From(ctx), "getAuditKey")
}
