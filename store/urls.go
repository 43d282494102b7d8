package store

import (
	"context"
	"fmt"

	"github.com/harebox/harebox/sandbox"
)

// URL is a published port's stored record: the API view without the
// token, and the token's hash.
type URL struct {
	sandbox.URL
	// TokenHash is the SHA-256 of the token, hex.
	TokenHash string `json:"token_hash"`
}

// PutURL implements Tx; a second URL for the same sandbox and port is
// ErrConflict.
func (s *DB) PutURL(ctx context.Context, u *URL) error {
	return s.put(ctx, "urls", []string{"id", "sandbox_id", "port", "created_at"},
		[]any{u.ID, u.SandboxID, u.Port, nanos(u.CreatedAt)}, u)
}

// GetURL implements Tx.
func (s *DB) GetURL(ctx context.Context, id string) (*URL, error) {
	return get[URL](ctx, s, `SELECT record FROM urls WHERE id = ?`, id)
}

// ListURLs implements Tx: a sandbox's ("" for every sandbox's).
func (s *DB) ListURLs(ctx context.Context, sandboxID string) ([]*URL, error) {
	if sandboxID == "" {
		return list[URL](ctx, s, `SELECT record FROM urls ORDER BY created_at, id`)
	}
	return list[URL](ctx, s, `SELECT record FROM urls WHERE sandbox_id = ? ORDER BY created_at, id`, sandboxID)
}

// DeleteURL implements Tx.
func (s *DB) DeleteURL(ctx context.Context, id string) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM urls WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete url: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// URLCA is a project's stored URL certificate authority. The private key
// of one the host made is in the secret store, under KeyName (a new name
// for each CA, so a failed change never pairs a CA with another's key).
type URLCA struct {
	sandbox.URLCA
	AccountID string `json:"account_id"`
	KeyName   string `json:"key_name,omitempty"`
}

// PutURLCA implements Tx: sets the project's CA, replacing any other.
func (s *DB) PutURLCA(ctx context.Context, ca *URLCA) error {
	return s.put(ctx, "url_cas", []string{"project_id"}, []any{ca.ProjectID}, ca)
}

// GetURLCA implements Tx.
func (s *DB) GetURLCA(ctx context.Context, projectID string) (*URLCA, error) {
	return get[URLCA](ctx, s, `SELECT record FROM url_cas WHERE project_id = ?`, projectID)
}

// DeleteURLCA implements Tx: the project's CA. Its certificates' records
// (revocations) stay: the same CA may be set again.
func (s *DB) DeleteURLCA(ctx context.Context, projectID string) error {
	res, err := s.q.ExecContext(ctx, `DELETE FROM url_cas WHERE project_id = ?`, projectID)
	if err != nil {
		return fmt.Errorf("store: delete url ca: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return ErrNotFound
	}
	return nil
}

// DeleteClientCerts implements Tx: a project's certificate records.
func (s *DB) DeleteClientCerts(ctx context.Context, projectID string) error {
	if _, err := s.q.ExecContext(ctx, `DELETE FROM url_certs WHERE project_id = ?`, projectID); err != nil {
		return fmt.Errorf("store: delete url certs: %w", err)
	}
	return nil
}

// PutClientCert implements Tx (certificate and key are never stored).
func (s *DB) PutClientCert(ctx context.Context, c *sandbox.ClientCert) error {
	r := *c
	r.Certificate, r.PrivateKey = "", ""
	return s.put(ctx, "url_certs", []string{"id", "project_id", "created_at"},
		[]any{c.ProjectID + "/" + c.Serial, c.ProjectID, nanos(c.CreatedAt)}, &r)
}

// GetClientCert implements Tx.
func (s *DB) GetClientCert(ctx context.Context, projectID, serial string) (*sandbox.ClientCert, error) {
	return get[sandbox.ClientCert](ctx, s, `SELECT record FROM url_certs WHERE id = ?`, projectID+"/"+serial)
}

// ListClientCerts implements Tx: a project's, oldest first.
func (s *DB) ListClientCerts(ctx context.Context, projectID string) ([]*sandbox.ClientCert, error) {
	return list[sandbox.ClientCert](ctx, s, `SELECT record FROM url_certs WHERE project_id = ? ORDER BY created_at, id`, projectID)
}
