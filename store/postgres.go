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
// URL or key=value settings, as libpq takes them) and migrates it. The
// store is written for several hosts (Update is serializable and retried
// on conflicts, migrations run one host at a time), but an engine still
// takes every sandbox in its store for its own: until hosts register and
// own their sandboxes, one DB holds the database, by a session advisory
// lock it keeps until Close; a second OpenPostgres of the same database
// fails with ErrInUse.
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
	if err := s.hold(ctx); err != nil {
		db.Close()
		return nil, err
	}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	s.lost, s.stop, s.kept = make(chan struct{}), make(chan struct{}), make(chan struct{})
	go s.keep()
	return s, nil
}

// pgHeartbeat is how often a store checks that it still holds its
// PostgreSQL database.
var pgHeartbeat = 5 * time.Second

// keep checks, until Close, that the owner lock is still held (its
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
			err = s.owner.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND pid = pg_backend_pid() AND granted)`, pgOwnerLock).Scan(&held)
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

// Lost is closed when another store took the PostgreSQL database this one
// held (its holder must stop: two engines would take the same sandboxes
// for their own); never for SQLite.
func (s *DB) Lost() <-chan struct{} { return s.lost }

// ErrInUse is returned by OpenPostgres when another store holds the
// database.
var ErrInUse = errors.New("store: another hareboxd uses this PostgreSQL database (one host per database until several hosts are supported)")

// pgOwnerLock is the session advisory lock of the store that holds a
// PostgreSQL database ("HBOW").
const pgOwnerLock = 0x48424f57

// hold takes the owner lock on a connection of its own, kept until Close.
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
	var ok bool
	if err := c.QueryRowContext(ctx, `SELECT pg_try_advisory_lock($1)`, pgOwnerLock).Scan(&ok); err != nil {
		c.Close()
		return fmt.Errorf("store: postgres: %w", err)
	}
	if !ok {
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
	s.owner.ExecContext(ctx, `SELECT pg_advisory_unlock($1)`, pgOwnerLock)
	cancel()
	s.owner.Raw(func(any) error { return driver.ErrBadConn })
	s.owner.Close()
	s.owner = nil
}
