// Package secrets keeps secret values. Store is the interface the engine
// uses; Sealed is the embedded default: values encrypted with AES-256-GCM
// under a host master key, kept in the engine's database.
package secrets

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/harebox/harebox/store"
)

// ErrNotFound is returned for a missing secret.
var ErrNotFound = errors.New("secret not found")

// Store keeps secrets by scope and name.
type Store interface {
	Put(ctx context.Context, scope, name string, value []byte) error
	Get(ctx context.Context, scope, name string) ([]byte, error)
	Delete(ctx context.Context, scope, name string) error
	// DeleteScope deletes every secret of a scope (a sandbox's, when it
	// is deleted).
	DeleteScope(ctx context.Context, scope string) error
	// Erase deletes a secret so that it cannot be recovered from the
	// store's files either (a data key: its crypto-erase). A missing
	// secret is ErrNotFound.
	Erase(ctx context.Context, scope, name string) error
}

// Sealed encrypts values before they reach the database.
type Sealed struct {
	db   store.Store
	aead cipher.AEAD
}

// NewSealed uses the 32-byte master key in keyFile, creating it (mode 0600)
// if it does not exist.
func NewSealed(db store.Store, keyFile string) (*Sealed, error) {
	aead, err := MasterKey(keyFile)
	if err != nil {
		return nil, err
	}
	return &Sealed{db: db, aead: aead}, nil
}

// MasterKey is the AEAD of the host's 32-byte master key in keyFile,
// created (mode 0600) if it does not exist; the host seals what it keeps
// in files under it too (its mesh tunnel's private key).
func MasterKey(keyFile string) (cipher.AEAD, error) {
	key, err := os.ReadFile(keyFile)
	if errors.Is(err, os.ErrNotExist) {
		if key, err = newMasterKey(keyFile); err != nil {
			return nil, err
		}
	} else if err != nil {
		return nil, fmt.Errorf("secrets: read master key: %w", err)
	}
	if len(key) != 32 {
		return nil, fmt.Errorf("secrets: master key %s: want 32 bytes, got %d", keyFile, len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// additional binds a ciphertext to its scope and name, so a sealed value
// copied to another row does not decrypt.
func additional(scope, name string) []byte { return []byte(scope + "\x00" + name) }

// Put implements Store.
func (s *Sealed) Put(ctx context.Context, scope, name string, value []byte) error {
	sealed, err := SealWith(s.aead, additional(scope, name), value)
	if err != nil {
		return err
	}
	return s.db.PutSecret(ctx, scope, name, sealed)
}

// Get implements Store.
func (s *Sealed) Get(ctx context.Context, scope, name string) ([]byte, error) {
	sealed, err := s.db.GetSecret(ctx, scope, name)
	if errors.Is(err, store.ErrNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	v, err := OpenWith(s.aead, additional(scope, name), sealed)
	if errors.Is(err, ErrDamaged) {
		return nil, errors.New("secrets: corrupt value")
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: %s/%s does not decrypt: %w", scope, name, err)
	}
	return v, nil
}

// Delete implements Store.
func (s *Sealed) Delete(ctx context.Context, scope, name string) error {
	err := s.db.DeleteSecret(ctx, scope, name)
	if errors.Is(err, store.ErrNotFound) {
		return ErrNotFound
	}
	return err
}

// Erase implements Store: the row goes, then the database scrubs it.
func (s *Sealed) Erase(ctx context.Context, scope, name string) error {
	if err := s.Delete(ctx, scope, name); err != nil {
		return err
	}
	return s.db.Scrub(ctx)
}

// DeleteScope implements Store.
func (s *Sealed) DeleteScope(ctx context.Context, scope string) error {
	return s.db.DeleteSecretScope(ctx, scope)
}

// newMasterKey writes a new master key to keyFile whole, or reads the one
// another process (a server sharing the file) wrote first.
func newMasterKey(keyFile string) ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(keyFile), ".master-key-*") // (mode 0600)
	if err != nil {
		return nil, fmt.Errorf("secrets: create master key: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.Write(key)
	if err == nil {
		err = f.Sync() // (linked in place only once on disk)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("secrets: write master key: %w", err)
	}
	// Linked in place once whole: a reader never sees part of it.
	if err := os.Link(f.Name(), keyFile); errors.Is(err, os.ErrExist) {
		return os.ReadFile(keyFile)
	} else if err != nil {
		return nil, fmt.Errorf("secrets: create master key: %w", err)
	}
	return key, nil
}
