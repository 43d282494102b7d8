package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// OpenPostgres connects to the PostgreSQL database at dsn (a postgres://
// URL or key=value settings, as libpq takes them) and migrates it. Several
// hosts share one database: Update is serializable and retried on
// conflicts, migrations run one host at a time, and each host holds its
// name (Claim) while it runs.
func OpenPostgres(ctx context.Context, dsn string) (*DB, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open postgres: %w", err)
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(4)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: connect to postgres: %w", err)
	}
	s := &DB{db: db, pg: true}
	s.q = s.wrap(db)
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Claim makes this store the only one of its database that runs as host
// (two engines by the same name would take the same sandboxes for their
// own): on PostgreSQL it holds a session advisory lock on the name until
// Close, and fails with ErrInUse if another store holds it. It can be
// claimed once. On SQLite (one host, one process) it does nothing.
func (s *DB) Claim(ctx context.Context, host string) error {
	if !s.pg {
		return nil
	}
	if s.host != "" {
		return fmt.Errorf("store: claimed as host %q already", s.host)
	}
	s.host = host
	if err := s.hold(ctx); err != nil {
		s.host = ""
		return err
	}
	s.lost, s.stop, s.kept = make(chan struct{}), make(chan struct{}), make(chan struct{})
	go s.keep()
	return nil
}

// Shared reports whether several hosts may share the store (PostgreSQL);
// a SQLite file is one host's.
func (s *DB) Shared() bool { return s.pg }

// pgHeartbeat is how often a store checks that it still holds its host's
// name.
var pgHeartbeat = 5 * time.Second

// keep checks, until Close, that the host lock is still held (its
// connection may die: a server restart, a dropped connection) and takes
// it again on a new connection if nobody else did. If another store did,
// Lost is closed: its holder must stop.
func (s *DB) keep() {
	defer close(s.kept)
	t := time.NewTicker(pgHeartbeat)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		held, err := false, error(nil)
		if s.owner != nil { // (nil: the last try to take it again failed)
			err = s.owner.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = $1 AND objid = $2 AND objsubid = 2 AND pid = pg_backend_pid() AND granted)`,
				pgHostLock, hostLockID(s.host)).Scan(&held)
		}
		if err != nil || !held {
			s.retire()
			err = s.hold(ctx)
		}
		cancel()
		// (Another error: the database cannot be reached, and nobody
		// else can take it while that lasts; it is tried again.)
		if errors.Is(err, ErrInUse) {
			close(s.lost)
			return
		}
	}
}

// Lost is closed when another store took the host name this one claimed
// (its holder must stop: two engines would take the same sandboxes for
// their own); never for SQLite, nor before Claim.
func (s *DB) Lost() <-chan struct{} { return s.lost }

// ErrInUse is returned by Claim when another store holds the host name.
var ErrInUse = errors.New("store: another hareboxd runs as this host on this PostgreSQL database (give each host its own name)")

// ErrOlderHost is returned by Claim when a hareboxd from before several
// hosts (which holds a database alone) runs on the database.
var ErrOlderHost = errors.New("store: an older hareboxd, which holds a PostgreSQL database alone, runs on this database: stop it first")

// pgHostLock is the class of the session advisory locks that hold host
// names ("HBOW"); the lock's other key is hostLockID of the name.
const pgHostLock = 0x48424f57

// hostLockID is a host name's 31-bit lock key (pg_locks shows it as an
// oid, so it stays positive): FNV-1a (two names with the same key would
// only keep each other from running at once).
func hostLockID(name string) int32 {
	h := uint32(2166136261)
	for i := 0; i < len(name); i++ {
		h ^= uint32(name[i])
		h *= 16777619
	}
	return int32(h & 0x7fffffff)
}

// hold takes the host lock on a connection of its own, kept until Close.
func (s *DB) hold(ctx context.Context) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: connect to postgres: %w", err)
	}
	// The session must outlive idleness, and a dead peer's must end soon
	// (a host that lost power would otherwise hold the lock for the
	// kernel's two hours of keepalive).
	for _, set := range []string{`SET idle_session_timeout = 0`, `SET tcp_keepalives_idle = 10`,
		`SET tcp_keepalives_interval = 5`, `SET tcp_keepalives_count = 3`} {
		if _, err := c.ExecContext(ctx, set); err != nil {
			c.Close()
			return fmt.Errorf("store: postgres: %w", err)
		}
	}
	var ok, shared bool
	if err := c.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1, $2), pg_try_advisory_lock_shared($3::bigint)`, pgHostLock, hostLockID(s.host), int64(pgHostLock)).Scan(&ok, &shared); err != nil {
		c.Close()
		return fmt.Errorf("store: postgres: %w", err)
	}
	if !shared {
		// A hareboxd from before several hosts holds the database
		// alone (its lock: this key, exclusive); hosts share it.
		c.Raw(func(any) error { return driver.ErrBadConn })
		c.Close()
		return ErrOlderHost
	}
	if !ok {
		c.Raw(func(any) error { return driver.ErrBadConn })
		c.Close()
		return ErrInUse
	}
	s.owner = c
	return nil
}

// pgQuerier numbers a query's ? placeholders ($1, $2, ...) for
// PostgreSQL (the store's queries have no ? in literals), makes its text
// arguments valid for a TEXT column (PostgreSQL refuses invalid UTF-8 and
// NUL, which SQLite keeps: a request's raw path reaches the audit log),
// and notes in conflict, if set, that the database aborted the
// transaction for a conflict: the caller of a statement may wrap or drop
// the error, and Update must run the transaction again all the same.
type pgQuerier struct {
	querier
	conflict *atomic.Bool
}

func (q pgQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	r, err := q.querier.ExecContext(ctx, numbered(query), text(args)...)
	return r, q.note(err)
}

func (q pgQuerier) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	r, err := q.querier.QueryContext(ctx, numbered(query), text(args)...)
	return r, q.note(err)
}

// QueryRowContext: a conflict is only known at Scan, which the caller
// does; Commit then fails with it (noted there).
func (q pgQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return q.querier.QueryRowContext(ctx, numbered(query), text(args)...)
}

func (q pgQuerier) note(err error) error {
	if q.conflict != nil && (retryable(err) || pgCode(err) == "25P02") {
		q.conflict.Store(true)
	}
	return err
}

// text makes string arguments storable in PostgreSQL's TEXT columns.
func text(args []any) []any {
	for i, a := range args {
		if s, ok := a.(string); ok && (!utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0) {
			args[i] = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
		}
	}
	return args
}

func numbered(query string) string {
	if !strings.Contains(query, "?") {
		return query
	}
	var b strings.Builder
	n := 0
	for _, r := range query {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// pgCode is the SQLSTATE of a PostgreSQL error, or "".
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// retryable reports whether PostgreSQL aborted a transaction for a
// conflict with another (serialization failure, deadlock): running it
// again may succeed.
func retryable(err error) bool {
	c := pgCode(err)
	return c == "40001" || c == "40P01"
}

// retire lets the owner lock go: unlocked (at once: the server would
// release it only when it notices the session's end), and its session
// closed rather than kept in the pool.
func (s *DB) retire() {
	if s.owner == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	s.owner.ExecContext(ctx, `SELECT pg_advisory_unlock($1, $2), pg_advisory_unlock_shared($3::bigint)`, pgHostLock, hostLockID(s.host), int64(pgHostLock))
	cancel()
	s.owner.Raw(func(any) error { return driver.ErrBadConn })
	s.owner.Close()
	s.owner = nil
}
