package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
	return s, nil
}

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
// PostgreSQL. The store's queries have no ? in literals.
type pgQuerier struct{ querier }

func (q pgQuerier) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return q.querier.ExecContext(ctx, numbered(query), args...)
}

func (q pgQuerier) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return q.querier.QueryContext(ctx, numbered(query), args...)
}

func (q pgQuerier) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return q.querier.QueryRowContext(ctx, numbered(query), args...)
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
