// Package store keeps the engine's state. Store is the interface every
// domain uses; SQLite (pure Go, modernc.org/sqlite) is the embedded
// implementation. Update runs a function in one transaction that may span
// domains (a project's check and a sandbox's record, a key and its
// children), written so that a PostgreSQL store can serve several hosts
// with the same contract: the function may run again after a conflict, so
// it must act only through its Tx.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"modernc.org/sqlite" // the "sqlite" database/sql driver
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/sandbox"
)

// ErrNotFound is returned for a missing record. It is of the kind
// sandbox.ErrNotFound: a miss that no caller words otherwise reaches the
// API as a 404, not a 500.
var ErrNotFound error = &sandbox.Error{Kind: sandbox.ErrNotFound, Msg: "store: not found"}

// ErrConflict is returned when a unique name is taken; it is of the kind
// sandbox.ErrExists.
var ErrConflict error = &sandbox.Error{Kind: sandbox.ErrExists, Msg: "store: conflict"}

// errRetry marks an error of a statement that lost a race with another
// transaction where PostgreSQL does not say so itself (a unique key taken
// meanwhile): Update runs the transaction again.
var errRetry = errors.New("lost a race with another transaction")

// Sandbox is a sandbox's stored record: the API view plus what the engine
// needs to re-adopt and clean it up.
type Sandbox struct {
	sandbox.Sandbox
	// Handle re-adopts the VM; empty until the VM is launched.
	Handle *hypervisor.Handle `json:"handle,omitempty"`
	// StateDir is the machine's directory on the host.
	StateDir string `json:"state_dir"`
	// Env is the create request's environment variables.
	Env map[string]string `json:"env,omitempty"`
	// Extra holds data owned by other parts of the engine (firewall
	// policy, network lease, ...), by key.
	Extra map[string]json.RawMessage `json:"extra,omitempty"`
	// EnvironmentID is the environment the sandbox pinned, if any.
	EnvironmentID string `json:"environment_id,omitempty"`
	// Placeholders maps the pinned version's secret variables to this
	// sandbox's placeholders for them (what the guest sees).
	Placeholders map[string]string `json:"placeholders,omitempty"`
	// KeyID is the API key that created the sandbox ("" for the
	// operator): key budgets and usage by key count it.
	KeyID string `json:"key_id,omitempty"`
	// KeyAncestors are the keys above KeyID: their budgets cover it too.
	KeyAncestors []string `json:"key_ancestors,omitempty"`
	// ImageDir is the image build the sandbox was created from: Start
	// boots it again on that build (its disk's base).
	ImageDir string `json:"image_dir,omitempty"`
	// Kept marks a sandbox stopped by a call: its disk, data key and
	// record stay, and Start boots it again (one that stopped on its own
	// lost them).
	Kept bool `json:"kept,omitempty"`
	// HibernatedBytes is what its hibernation files take, while it is
	// hibernated (metered as snapshot storage).
	HibernatedBytes int64 `json:"hibernated_bytes,omitempty"`
}

// SetExtra keeps v, as JSON, in the record's Extra under k (the key of
// the part of the engine that owns it). v is a value that encodes: a
// number, a string, or JSON already (json.RawMessage).
func (s *Sandbox) SetExtra(k string, v any) {
	if s.Extra == nil {
		s.Extra = map[string]json.RawMessage{}
	}
	b, _ := json.Marshal(v)
	s.Extra[k] = b
}

// Store is the engine's state storage.
type Store interface {
	Tx
	// Update runs fn in one transaction: all of its writes commit or none
	// do. fn may run more than once; it must act only through tx (on
	// SQLite, a call on the Store inside fn would wait for fn forever).
	Update(ctx context.Context, fn func(tx Tx) error) error
	// Scrub makes the rows deleted so far unrecoverable from the store's
	// own files (what a crypto-erase needs after deleting a key). It is
	// not a transaction's: it acts on what has committed.
	Scrub(ctx context.Context) error
	// Ping checks that the database answers a read.
	Ping(ctx context.Context) error
	// TakeToken takes one request from a rate limit's token bucket shared
	// by the hosts (filling at perSecond, up to burst), or says how long
	// until it has one.
	TakeToken(ctx context.Context, key string, perSecond float64, burst int, now time.Time) (wait time.Duration, err error)
	// Listen calls fn, one call at a time, with every change notified
	// (Notify) from then until ctx ends. When changes may have been missed
	// (the connection that listens was lost), fn gets topic "": whatever
	// it caches may be stale. It returns once it listens: a change
	// notified after it returned reaches fn (a first try that failed
	// counts as a lost connection).
	Listen(ctx context.Context, fn func(topic, payload string))
	Close() error
}

// Tx is what one transaction (or one call on the Store) can do.
type Tx interface {
	// PutSandbox inserts or replaces a record.
	PutSandbox(ctx context.Context, s *Sandbox) error
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	// ListSandboxes returns every record, deleted ones too, oldest first.
	ListSandboxes(ctx context.Context) ([]*Sandbox, error)
	DeleteSandbox(ctx context.Context, id string) error
	// CountLive counts the sandboxes that are not deleted in an account
	// and, when given, a project and a fleet.
	CountLive(ctx context.Context, accountID, projectID, fleetID string) (int, error)

	// AddUsage appends a metered interval.
	AddUsage(ctx context.Context, u Usage) error
	// ListUsage returns a sandbox's intervals, oldest first.
	ListUsage(ctx context.Context, sandboxID string) ([]Usage, error)
	// QueryUsage returns the intervals f selects, oldest first.
	QueryUsage(ctx context.Context, f UsageFilter) ([]Usage, error)

	// Budgets, and the reservations live sandboxes hold against them.
	// CandidateBudgets returns an account's budgets that may cover a
	// sandbox in projectID, fleetID, created by a key of keyIDs, with
	// labels: every account budget, those whose ref is one of these, and
	// the label budgets indexed by one of its labels (the caller matches
	// the rest), in no particular order.
	PutBudget(ctx context.Context, b *Budget) error
	GetBudget(ctx context.Context, id string) (*Budget, error)
	ListBudgets(ctx context.Context, accountID string) ([]*Budget, error)
	CandidateBudgets(ctx context.Context, accountID, projectID, fleetID string, keyIDs []string, labels map[string]string) ([]*Budget, error)
	DeleteBudget(ctx context.Context, id string) error
	// Monitoring samples. ListMetrics returns a sandbox's from from (at or
	// after) to to (before; zero: unbounded), oldest first, at most limit.
	PutMetrics(ctx context.Context, m *MetricSample) error
	ListMetrics(ctx context.Context, sandboxID string, from, to time.Time, limit int) ([]*MetricSample, error)
	PurgeMetrics(ctx context.Context, accountID string, before time.Time) error
	// Snapshots, oldest first.
	PutSnapshot(ctx context.Context, s *Snapshot) error
	GetSnapshot(ctx context.Context, id string) (*Snapshot, error)
	ListSnapshots(ctx context.Context) ([]*Snapshot, error)
	DeleteSnapshot(ctx context.Context, id string) error
	PutReservation(ctx context.Context, r *Reservation) error
	GetReservation(ctx context.Context, sandboxID string) (*Reservation, error)
	ListReservations(ctx context.Context) ([]*Reservation, error)
	DeleteReservation(ctx context.Context, sandboxID string) error

	// Secret rows hold values already encrypted by the caller.
	PutSecret(ctx context.Context, scope, name string, sealed []byte) error
	GetSecret(ctx context.Context, scope, name string) ([]byte, error)
	DeleteSecret(ctx context.Context, scope, name string) error
	// DeleteSecretScope deletes every secret row of a scope.
	DeleteSecretScope(ctx context.Context, scope string) error

	// Command history index (the entries are sealed secrets).
	PutCommand(ctx context.Context, c *CommandRow) error
	ListCommands(ctx context.Context, sandboxID string, limit int) ([]*CommandRow, error)
	// OldCommands lists an account's entries started before t, and, with
	// withOutput, only those whose output is still kept.
	OldCommands(ctx context.Context, accountID string, before time.Time, withOutput bool) ([]*CommandRow, error)
	DeleteCommand(ctx context.Context, id string) error
	DeleteCommands(ctx context.Context, sandboxID string) error

	// Tenancy. Put fails with ErrConflict when the name is taken in its
	// parent; the Get methods fail with ErrNotFound.
	PutAccount(ctx context.Context, a *Account) error
	GetAccount(ctx context.Context, id string) (*Account, error)
	AccountByName(ctx context.Context, name string) (*Account, error)
	ListAccounts(ctx context.Context) ([]*Account, error)
	DeleteAccount(ctx context.Context, id string) error
	PutProject(ctx context.Context, p *Project) error
	GetProject(ctx context.Context, id string) (*Project, error)
	ProjectByName(ctx context.Context, accountID, name string) (*Project, error)
	ListProjects(ctx context.Context, accountID string) ([]*Project, error)
	DeleteProject(ctx context.Context, id string) error
	PutFleet(ctx context.Context, f *Fleet) error
	GetFleet(ctx context.Context, id string) (*Fleet, error)
	FleetByName(ctx context.Context, projectID, name string) (*Fleet, error)
	ListFleets(ctx context.Context, projectID string) ([]*Fleet, error)
	DeleteFleet(ctx context.Context, id string) error

	// Environments and their versions. PutEnvironment fails with
	// ErrConflict when the name is taken in the project; PutEnvVersion
	// with ErrConflict when the version exists (versions never change).
	PutEnvironment(ctx context.Context, e *Environment) error
	GetEnvironment(ctx context.Context, id string) (*Environment, error)
	EnvironmentByName(ctx context.Context, projectID, name string) (*Environment, error)
	ListEnvironments(ctx context.Context, projectID string) ([]*Environment, error)
	DeleteEnvironment(ctx context.Context, id string) error
	PutEnvVersion(ctx context.Context, v *EnvVersion) error
	GetEnvVersion(ctx context.Context, environmentID string, version int) (*EnvVersion, error)
	ListEnvVersions(ctx context.Context, environmentID string) ([]*EnvVersion, error)
	// CountLiveWithEnvironment counts sandboxes not deleted that pinned it.
	CountLiveWithEnvironment(ctx context.Context, environmentID string) (int, error)

	// The audit log. AppendAudit adds an entry (ErrConflict if its Seq
	// exists); LastAudit returns the newest (ErrNotFound if none).
	AppendAudit(ctx context.Context, e *AuditEntry) error
	LastAudit(ctx context.Context) (*AuditEntry, error)
	ListAudit(ctx context.Context, f AuditFilter) ([]*AuditEntry, error)
	PutAuditCheckpoint(ctx context.Context, c *AuditCheckpoint) error
	ListAuditCheckpoints(ctx context.Context) ([]*AuditCheckpoint, error)

	// Published ports (the ingress's URLs). PutURL fails with ErrConflict
	// when the sandbox's port has a URL already.
	PutURL(ctx context.Context, u *URL) error
	GetURL(ctx context.Context, id string) (*URL, error)
	ListURLs(ctx context.Context, sandboxID string) ([]*URL, error)
	DeleteURL(ctx context.Context, id string) error
	// The certificate authorities of projects' mtls URLs, and the
	// client certificates a project issued or revoked.
	PutURLCA(ctx context.Context, ca *URLCA) error
	GetURLCA(ctx context.Context, projectID string) (*URLCA, error)
	DeleteURLCA(ctx context.Context, projectID string) error
	DeleteClientCerts(ctx context.Context, projectID string) error
	PutClientCert(ctx context.Context, c *sandbox.ClientCert) error
	GetClientCert(ctx context.Context, projectID, serial string) (*sandbox.ClientCert, error)
	ListClientCerts(ctx context.Context, projectID string) ([]*sandbox.ClientCert, error)

	// The mesh: each project's range and each sandbox's address, unique
	// in the deployment (AddMeshRange and AddMeshAddress fail with
	// ErrConflict when taken).
	MeshRanges(ctx context.Context) (map[string]string, error)
	AddMeshRange(ctx context.Context, projectID, prefix string) error
	MeshAddresses(ctx context.Context, projectID string) ([]*MeshAddress, error)
	AddMeshAddress(ctx context.Context, a *MeshAddress) error
	MeshAddressByName(ctx context.Context, projectID, name string) (*MeshAddress, error)
	DeleteMeshAddress(ctx context.Context, sandboxID string) error
	MeshAddressesByHost(ctx context.Context) (map[string][]string, error)

	// Volumes. PutVolume fails with ErrConflict when the name is taken
	// in the project.
	PutVolume(ctx context.Context, v *Volume) error
	GetVolume(ctx context.Context, id string) (*Volume, error)
	VolumeByName(ctx context.Context, projectID, name string) (*Volume, error)
	// ListVolumes lists a project's volumes ("" for every project's),
	// oldest first.
	ListVolumes(ctx context.Context, projectID string) ([]*Volume, error)
	DeleteVolume(ctx context.Context, id string) error

	// API keys, with the hash of their secret.
	PutKey(ctx context.Context, k *Key) error
	GetKey(ctx context.Context, id string) (*Key, error)
	// ListKeys lists an account's keys ("" for every account), oldest first.
	ListKeys(ctx context.Context, accountID string) ([]*Key, error)

	// The hosts of a deployment that shares the store.
	PutHost(ctx context.Context, h *Host) error
	GetHost(ctx context.Context, name string) (*Host, error)
	ListHosts(ctx context.Context) ([]*Host, error)
	DeleteHost(ctx context.Context, name string) error
	// SandboxesOn returns the records of a host's sandboxes, oldest first:
	// those in one of states, or all of them.
	SandboxesOn(ctx context.Context, host string, states ...sandbox.State) ([]*Sandbox, error)

	// The deployment's settings, each a JSON value under a name
	// (settings.go); GetSetting and DeleteSetting fail with ErrNotFound
	// when it has none.
	PutSetting(ctx context.Context, name string, value json.RawMessage) error
	GetSetting(ctx context.Context, name string) (json.RawMessage, error)
	DeleteSetting(ctx context.Context, name string) error

	// Browser sessions (sessions.go), found by their ID's hash.
	// GetSession, TouchSession and DeleteSession fail with ErrNotFound
	// when it has none; PruneSessions deletes those ended by now and, of
	// a key's, all but its keep latest to end; DeleteKeySessions deletes
	// every session of a key.
	PutSession(ctx context.Context, s *Session) error
	GetSession(ctx context.Context, idHash string) (*Session, error)
	TouchSession(ctx context.Context, idHash string, used, ends time.Time) error
	DeleteSession(ctx context.Context, idHash string) error
	PruneSessions(ctx context.Context, now time.Time, keyID string, keep int) error
	DeleteKeySessions(ctx context.Context, keyID string) error

	// Notify tells every host that shares the store, this one included,
	// of a change (topic and payload, together at most 4000 bytes) once the
	// transaction commits; never if it does not.
	Notify(ctx context.Context, topic, payload string) error
}

// DB is a Store on SQL: SQLite (OpenSQLite, embedded, one host) or
// PostgreSQL (OpenPostgres, shared by hosts). Both run the same tables and
// queries (written with ? placeholders, which the PostgreSQL querier
// numbers); where they differ, pg says which.
type DB struct {
	db   *sql.DB
	q    querier // db, or the transaction of an Update (wrapped: see wrap)
	pg   bool
	inTx bool
	// owner holds PostgreSQL's lock on the host name (see Claim), kept
	// by keep until stop; lost is closed if another store took it.
	host             string
	owner            *sql.Conn
	lost, stop, kept chan struct{}
	// hub delivers SQLite's notices; pending holds those of a SQLite
	// transaction until it commits.
	hub     *hub
	pending *[]notice
}

// wrap is q as the store uses it: placeholders numbered for PostgreSQL,
// and a full disk turned into the engine's capacity error.
func (s *DB) wrap(q querier) querier { return s.wrapTx(q, nil) }

// wrapTx is wrap for a transaction, whose conflicts PostgreSQL notes in
// conflict.
func (s *DB) wrapTx(q querier, conflict *atomic.Bool) querier {
	if s.pg {
		return fullAware{pgQuerier{q, conflict}}
	}
	return fullAware{q}
}

// fullAware turns a full disk into the engine's capacity error, once for
// every write.
type fullAware struct{ querier }

func (f fullAware) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	r, err := f.querier.ExecContext(ctx, query, args...)
	return r, full(err)
}

// full makes SQLite's SQLITE_FULL, PostgreSQL's disk_full, or ENOSPC from
// below them, an *sandbox.Error of kind ErrCapacity: the caller gets a
// clear "full", and nothing was written.
func full(err error) error {
	var se *sqlite.Error
	if err != nil && ((errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_FULL) || pgCode(err) == "53100" || errors.Is(err, syscall.ENOSPC)) {
		return &sandbox.Error{Kind: sandbox.ErrCapacity, Msg: "the database's disk is full", Err: err}
	}
	return err
}

// isUnique reports whether err is a unique constraint's violation.
func isUnique(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "UNIQUE constraint failed") || pgCode(err) == "23505")
}

// querier is what *sql.DB and *sql.Tx share.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var _ Store = (*DB)(nil)

// migrations run in order, once each; append, never edit.
var migrations = []string{
	`CREATE TABLE sandboxes (
		id         TEXT PRIMARY KEY,
		state      TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER,
		record     TEXT NOT NULL
	);
	CREATE INDEX sandboxes_expires ON sandboxes(expires_at) WHERE expires_at IS NOT NULL;`,
	`CREATE TABLE usage (
		sandbox_id TEXT NOT NULL,
		start_ns   INTEGER NOT NULL,
		end_ns     INTEGER NOT NULL,
		vcpus      INTEGER NOT NULL,
		memory_mb  INTEGER NOT NULL
	);
	CREATE INDEX usage_sandbox ON usage(sandbox_id);
	CREATE TABLE secrets (
		scope TEXT NOT NULL,
		name  TEXT NOT NULL,
		value BLOB NOT NULL,
		PRIMARY KEY (scope, name)
	);`,
	// Tenancy and keys. Records are JSON; the columns are what queries
	// and constraints need. Portable to PostgreSQL as written.
	`CREATE TABLE accounts (
		id         TEXT PRIMARY KEY,
		name       TEXT NOT NULL UNIQUE,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL
	);
	CREATE TABLE projects (
		id         TEXT PRIMARY KEY,
		account_id TEXT NOT NULL,
		name       TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL,
		UNIQUE (account_id, name)
	);
	CREATE TABLE fleets (
		id         TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		name       TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL,
		UNIQUE (project_id, name)
	);
	CREATE TABLE api_keys (
		id         TEXT PRIMARY KEY,
		account_id TEXT NOT NULL,
		hash       BLOB NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL
	);
	CREATE INDEX api_keys_account ON api_keys(account_id);
	ALTER TABLE sandboxes ADD COLUMN account_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN project_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN fleet_id TEXT NOT NULL DEFAULT '';
	CREATE INDEX sandboxes_project ON sandboxes(account_id, project_id, fleet_id, state);`,
	// Environments and their immutable versions.
	`CREATE TABLE environments (
		id         TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		name       TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL,
		UNIQUE (project_id, name)
	);
	CREATE TABLE env_versions (
		environment_id TEXT NOT NULL,
		version        INTEGER NOT NULL,
		created_at     BIGINT NOT NULL,
		record         TEXT NOT NULL,
		PRIMARY KEY (environment_id, version)
	);
	ALTER TABLE sandboxes ADD COLUMN environment_id TEXT NOT NULL DEFAULT '';`,
	// The audit log: append-only, hash-chained; signed checkpoints.
	`CREATE TABLE audit_log (
		seq        BIGINT PRIMARY KEY,
		time       BIGINT NOT NULL,
		account_id TEXT NOT NULL,
		principal  TEXT NOT NULL,
		action     TEXT NOT NULL,
		target     TEXT NOT NULL,
		outcome    TEXT NOT NULL,
		record     TEXT NOT NULL
	);
	CREATE INDEX audit_time ON audit_log(time);
	CREATE TABLE audit_checkpoints (
		seq    BIGINT PRIMARY KEY,
		record TEXT NOT NULL
	);`,
	// Command history: an index; each entry itself is sealed in secrets.
	`CREATE TABLE commands (
		id            TEXT PRIMARY KEY,
		sandbox_id    TEXT NOT NULL,
		account_id    TEXT NOT NULL,
		started_at    BIGINT NOT NULL,
		output_purged INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX commands_sandbox ON commands(sandbox_id, started_at);
	CREATE INDEX commands_account ON commands(account_id, started_at);`,
	// Budgets, reservations and priced usage.
	`CREATE TABLE budgets (
		id         TEXT PRIMARY KEY,
		account_id TEXT NOT NULL,
		scope_kind TEXT NOT NULL,
		scope_ref  TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL
	);
	CREATE INDEX budgets_scope ON budgets(account_id, scope_kind, scope_ref);
	CREATE TABLE reservations (
		sandbox_id TEXT PRIMARY KEY,
		record     TEXT NOT NULL
	);
	ALTER TABLE usage ADD COLUMN account_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE usage ADD COLUMN project_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE usage ADD COLUMN fleet_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE usage ADD COLUMN key_id TEXT NOT NULL DEFAULT '';
	ALTER TABLE usage ADD COLUMN labels TEXT NOT NULL DEFAULT 'null';
	ALTER TABLE usage ADD COLUMN disk_gb INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE usage ADD COLUMN paused BOOLEAN NOT NULL DEFAULT FALSE;
	ALTER TABLE usage ADD COLUMN cost BIGINT NOT NULL DEFAULT 0;
	ALTER TABLE usage ADD COLUMN egress_bytes BIGINT NOT NULL DEFAULT 0;
	CREATE INDEX usage_account ON usage(account_id, end_ns);`,
	// Monitoring samples, kept per the account's history retention.
	`CREATE TABLE metrics (
		id         TEXT PRIMARY KEY,
		sandbox_id TEXT NOT NULL,
		account_id TEXT NOT NULL,
		time_ns    BIGINT NOT NULL,
		record     TEXT NOT NULL
	);
	CREATE INDEX metrics_sandbox ON metrics(sandbox_id, time_ns);
	CREATE INDEX metrics_account ON metrics(account_id, time_ns);`,
	`CREATE TABLE snapshots (
		id         TEXT PRIMARY KEY,
		account_id TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL
	);
	CREATE INDEX snapshots_account ON snapshots(account_id, created_at);`,
	`ALTER TABLE usage ADD COLUMN snapshot_bytes BIGINT NOT NULL DEFAULT 0;`,
	`CREATE TABLE urls (
		id         TEXT PRIMARY KEY,
		sandbox_id TEXT NOT NULL,
		port       INTEGER NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL,
		UNIQUE (sandbox_id, port)
	);`,
	`CREATE TABLE url_cas (
		project_id TEXT PRIMARY KEY,
		record     TEXT NOT NULL
	);
	CREATE TABLE url_certs (
		id         TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		created_at BIGINT NOT NULL,
		record     TEXT NOT NULL
	);
	CREATE INDEX url_certs_project ON url_certs(project_id, created_at);`,
	// Several hosts: the hosts' leases, and which host runs a sandbox.
	`CREATE TABLE hosts (
		name        TEXT PRIMARY KEY,
		lease_until BIGINT NOT NULL,
		record      TEXT NOT NULL
	);
	ALTER TABLE sandboxes ADD COLUMN host TEXT NOT NULL DEFAULT '';
	CREATE INDEX sandboxes_host ON sandboxes(host, state);`,
	// Rate limits' token buckets, shared by the hosts.
	`CREATE TABLE key_buckets (
		key_id     TEXT PRIMARY KEY,
		tokens     DOUBLE PRECISION NOT NULL,
		updated_ns BIGINT NOT NULL,
		rate       DOUBLE PRECISION NOT NULL,
		burst      DOUBLE PRECISION NOT NULL
	);`,
	// The mesh: a range per project, an address per sandbox, unique in
	// the deployment.
	`CREATE TABLE mesh_ranges (
		prefix     TEXT PRIMARY KEY,
		project_id TEXT NOT NULL UNIQUE
	);
	CREATE TABLE mesh_addresses (
		addr       TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		sandbox_id TEXT NOT NULL UNIQUE,
		name       TEXT NOT NULL
	);
	CREATE INDEX mesh_addresses_name ON mesh_addresses(project_id, name);`,
	// Volumes, unique by name in their project.
	`CREATE TABLE volumes (
		id         TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		name       TEXT NOT NULL,
		created_at INTEGER NOT NULL,
		record     TEXT NOT NULL,
		UNIQUE (project_id, name)
	);`,
	// The deployment's settings (settings.go).
	`CREATE TABLE settings (
		name   TEXT PRIMARY KEY,
		record TEXT NOT NULL
	);`,
	// Browser sessions that stand for API keys (sessions.go).
	`CREATE TABLE sessions (
		id_hash    TEXT PRIMARY KEY,
		key_id     TEXT NOT NULL,
		expires_at BIGINT NOT NULL,
		used_at    BIGINT NOT NULL,
		ends_at    BIGINT NOT NULL,
		sealed     BLOB NOT NULL
	);
	CREATE INDEX sessions_ends ON sessions(ends_at);
	CREATE INDEX sessions_key ON sessions(key_id, ends_at);`,
}

// OpenSQLite opens (creating if needed) the database at path and migrates it.
func OpenSQLite(ctx context.Context, path string) (*DB, error) {
	// secure_delete: a deleted row (a sandbox's data key, whose erasure
	// is its crypto-erase) is overwritten with zeros, not left in a free
	// page.
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_pragma=secure_delete(1)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	// One writer at a time is what SQLite does anyway; a single connection
	// avoids SQLITE_BUSY between our own connections.
	db.SetMaxOpenConns(1)
	s := &DB{db: db, hub: &hub{listeners: map[*listener]bool{}}}
	s.q = s.wrap(db)
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// migrate runs the migrations this database has not had, each in its
// own transaction. On PostgreSQL the transactions take an advisory lock
// first, so hosts starting together migrate one at a time.
func (s *DB) migrate(ctx context.Context) error {
	for {
		done, err := s.migrateOne(ctx)
		if err != nil || done {
			return err
		}
	}
}

// pgMigrationLock is the advisory lock the migrations of a PostgreSQL
// database take ("HBMI").
const pgMigrationLock = 0x48424d49

func (s *DB) migrateOne(ctx context.Context) (done bool, err error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("store: migrate: %w", err)
	}
	defer tx.Rollback()
	q := s.wrap(tx)
	if s.pg {
		if _, err := q.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, pgMigrationLock); err != nil {
			return false, fmt.Errorf("store: migrate: %w", err)
		}
	}
	if _, err := q.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return false, fmt.Errorf("store: migrate: %w", err)
	}
	var have int
	if err := q.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
		return false, fmt.Errorf("store: migrate: %w", err)
	}
	if have > len(migrations) {
		return false, fmt.Errorf("store: database schema version %d is newer than this binary's %d", have, len(migrations))
	}
	if have == len(migrations) {
		return true, tx.Commit()
	}
	v := have + 1
	for _, stmt := range s.statements(migrations[v-1]) {
		if _, err := q.ExecContext(ctx, stmt); err != nil {
			return false, fmt.Errorf("store: migration %d: %w", v, err)
		}
	}
	if _, err := q.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, v, time.Now().Unix()); err != nil {
		return false, fmt.Errorf("store: migration %d: %w", v, err)
	}
	if err := tx.Commit(); err != nil {
		return false, fmt.Errorf("store: migration %d: %w", v, err)
	}
	return false, nil
}

// statements is a migration as this database runs it. SQLite takes it
// whole. PostgreSQL takes one statement at a time, with its own names for
// two types: INTEGER is 32 bits there (the columns hold nanoseconds), and
// bytes are BYTEA.
func (s *DB) statements(m string) []string {
	if !s.pg {
		return []string{m}
	}
	m = strings.NewReplacer(" INTEGER", " BIGINT", " BLOB", " BYTEA").Replace(m)
	var out []string
	for _, st := range strings.Split(m, ";") {
		if st = strings.TrimSpace(st); st != "" {
			out = append(out, st)
		}
	}
	return out
}

// Close closes the database (and lets another store hold it).
func (s *DB) Close() error {
	if s.stop != nil {
		select {
		case <-s.stop:
		default:
			close(s.stop)
		}
		<-s.kept // keep uses owner until it returns
	}
	if s.pg && !s.inTx {
		s.retire()
	}
	return s.db.Close()
}

// Ping implements Store.
func (s *DB) Ping(ctx context.Context) error {
	var n int
	return s.db.QueryRowContext(ctx, "SELECT 1").Scan(&n)
}

// Update implements Store. SQLite runs one transaction at a time (the
// store has one connection), so fn never conflicts and runs once.
// PostgreSQL runs it serializable, and again (up to 20 times, after a short
// random wait) when the database aborts it for a conflict with another
// transaction; fn acts only through its Tx, so running it again is safe.
func (s *DB) Update(ctx context.Context, fn func(tx Tx) error) error {
	if s.inTx {
		return fn(s) // already inside a transaction
	}
	var opts *sql.TxOptions
	if s.pg {
		opts = &sql.TxOptions{Isolation: sql.LevelSerializable}
	}
	for attempt := 1; ; attempt++ {
		conflict, err := s.update(ctx, opts, fn)
		if !s.pg || err == nil || !(conflict || retryable(err) || errors.Is(err, errRetry)) {
			return err
		}
		if attempt == 20 {
			return &sandbox.Error{Kind: sandbox.ErrUnavailable, Msg: "the database is busy with conflicting changes; try again", Err: err}
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Duration(attempt) * time.Duration(1+mathrand.IntN(5)) * time.Millisecond):
		}
	}
}

// update runs fn in one transaction; conflict says whether PostgreSQL
// aborted it for a conflict, whatever fn made of the error.
func (s *DB) update(ctx context.Context, opts *sql.TxOptions, fn func(tx Tx) error) (conflict bool, err error) {
	tx, err := s.db.BeginTx(ctx, opts)
	if err != nil {
		return false, fmt.Errorf("store: begin: %w", err)
	}
	var c atomic.Bool
	var pending []notice
	if err := fn(&DB{db: s.db, q: s.wrapTx(tx, &c), pg: s.pg, inTx: true, hub: s.hub, pending: &pending}); err != nil {
		tx.Rollback()
		return c.Load(), err
	}
	if err := tx.Commit(); err != nil {
		return c.Load() || retryable(err), fmt.Errorf("store: commit: %w", full(err))
	}
	if len(pending) > 0 {
		s.hub.publish(pending)
	}
	return false, nil
}

// PutSandbox implements Store.
func (s *DB) PutSandbox(ctx context.Context, sb *Sandbox) error {
	b, err := json.Marshal(sb)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	var exp sql.NullInt64
	if sb.ExpiresAt != nil {
		exp = sql.NullInt64{Int64: sb.ExpiresAt.UnixNano(), Valid: true}
	}
	_, err = s.q.ExecContext(ctx, `INSERT INTO sandboxes (id, state, created_at, expires_at, record, account_id, project_id, fleet_id, environment_id, host) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT(id) DO UPDATE SET state = excluded.state, expires_at = excluded.expires_at, record = excluded.record,
			account_id = excluded.account_id, project_id = excluded.project_id, fleet_id = excluded.fleet_id, environment_id = excluded.environment_id, host = excluded.host`,
		sb.ID, string(sb.State), sb.CreatedAt.UnixNano(), exp, string(b), sb.AccountID, sb.ProjectID, sb.FleetID, sb.EnvironmentID, sb.Host)
	if err != nil {
		return fmt.Errorf("store: put %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox implements Store.
func (s *DB) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var rec string
	err := s.q.QueryRowContext(ctx, `SELECT record FROM sandboxes WHERE id = ?`, id).Scan(&rec)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get %s: %w", id, err)
	}
	return decode(rec)
}

// ListSandboxes implements Store.
func (s *DB) ListSandboxes(ctx context.Context) ([]*Sandbox, error) {
	rows, err := s.q.QueryContext(ctx, `SELECT record FROM sandboxes ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("store: list: %w", err)
	}
	defer rows.Close()
	var out []*Sandbox
	for rows.Next() {
		var rec string
		if err := rows.Scan(&rec); err != nil {
			return nil, fmt.Errorf("store: list: %w", err)
		}
		sb, err := decode(rec)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// DeleteSandbox implements Store.
func (s *DB) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

func decode(rec string) (*Sandbox, error) {
	var sb Sandbox
	if err := json.Unmarshal([]byte(rec), &sb); err != nil {
		return nil, fmt.Errorf("store: corrupt record: %w", err)
	}
	return &sb, nil
}

// PutSecret implements Store.
func (s *DB) PutSecret(ctx context.Context, scope, name string, sealed []byte) error {
	_, err := s.q.ExecContext(ctx, `INSERT INTO secrets (scope, name, value) VALUES (?, ?, ?)
		ON CONFLICT(scope, name) DO UPDATE SET value = excluded.value`, scope, name, sealed)
	if err != nil {
		return fmt.Errorf("store: put secret: %w", err)
	}
	return nil
}

// GetSecret implements Store.
func (s *DB) GetSecret(ctx context.Context, scope, name string) ([]byte, error) {
	var v []byte
	err := s.q.QueryRowContext(ctx, `SELECT value FROM secrets WHERE scope = ? AND name = ?`, scope, name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("store: get secret: %w", err)
	}
	return v, nil
}

// DeleteSecretScope implements Tx.
func (s *DB) DeleteSecretScope(ctx context.Context, scope string) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM secrets WHERE scope = ?`, scope); err != nil {
		return fmt.Errorf("store: delete secrets: %w", err)
	}
	return nil
}

// Scrub implements Store. secure_delete already zeroes a deleted row in
// its page; the write-ahead log still holds the page as it was, so it is
// checkpointed and truncated. A checkpoint that a reader in another
// process keeps from completing reports busy rather than failing, and a
// scrub that did not happen must not pass for one.
//
// PostgreSQL: the secrets table is rewritten (VACUUM FULL), so the deleted
// rows' tuples are no longer in its files; the server's write-ahead log
// (and any backup or replica) keeps them until it is recycled, which this
// cannot reach.
func (s *DB) Scrub(ctx context.Context) error {
	if s.pg {
		if _, err := s.db.ExecContext(ctx, `VACUUM FULL secrets`); err != nil {
			return fmt.Errorf("store: scrub: %w", err)
		}
		return nil
	}
	var busy, logFrames, done int
	for attempt := 0; ; attempt++ {
		if err := s.db.QueryRowContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`).Scan(&busy, &logFrames, &done); err != nil {
			return fmt.Errorf("store: scrub: %w", err)
		}
		if busy == 0 {
			return nil
		}
		if attempt == 2 {
			return fmt.Errorf("store: scrub: the checkpoint stayed blocked by another reader of the database (%d of %d pages copied)", done, logFrames)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("store: scrub: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DeleteSecret implements Store.
func (s *DB) DeleteSecret(ctx context.Context, scope, name string) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM secrets WHERE scope = ? AND name = ?`, scope, name)
	if err != nil {
		return fmt.Errorf("store: delete secret: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}
