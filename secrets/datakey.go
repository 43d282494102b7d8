package secrets

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
)

// DataKeyName is the secret that holds a scope's data key.
const DataKeyName = "data-key"

// DataKeySize is a data key's length (AES-256).
const DataKeySize = 32

// A data key encrypts everything derived from one scope (a sandbox's disk,
// memory snapshots, stored env and command history). It is kept only in
// the Store, which seals it under the host's master key; erasing it is
// what makes the scope's data unreadable (crypto-erase).

// NewDataKey makes a random data key for scope and keeps it in s.
func NewDataKey(ctx context.Context, s Store, scope string) ([]byte, error) {
	k := make([]byte, DataKeySize)
	if _, err := rand.Read(k); err != nil {
		return nil, err
	}
	if err := s.Put(ctx, scope, DataKeyName, k); err != nil {
		return nil, fmt.Errorf("secrets: keep data key: %w", err)
	}
	return k, nil
}

// KeepDataKey keeps a data key the caller made as scope's own (a
// snapshot's, whose files were written under it).
func KeepDataKey(ctx context.Context, s Store, scope string, key []byte) error {
	if len(key) != DataKeySize {
		return fmt.Errorf("secrets: a data key is %d bytes, not %d", DataKeySize, len(key))
	}
	if err := s.Put(ctx, scope, DataKeyName, key); err != nil {
		return fmt.Errorf("secrets: keep data key: %w", err)
	}
	return nil
}

// DataKey returns scope's data key, or ErrNotFound if it has none (it
// predates data keys, or it was erased).
func DataKey(ctx context.Context, s Store, scope string) ([]byte, error) {
	k, err := s.Get(ctx, scope, DataKeyName)
	if err != nil {
		return nil, err
	}
	if len(k) != DataKeySize {
		return nil, fmt.Errorf("secrets: %s data key is %d bytes", scope, len(k))
	}
	return k, nil
}

// EraseDataKey destroys scope's data key; a missing one is no error.
func EraseDataKey(ctx context.Context, s Store, scope string) error {
	if err := s.Erase(ctx, scope, DataKeyName); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Seal encrypts v under a data key (AES-256-GCM), bound to label so that
// a value cannot be moved to another place that uses the same key.
func Seal(key []byte, label string, v []byte) ([]byte, error) {
	aead, err := gcm(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, v, []byte(label)), nil
}

// Open decrypts what Seal made under the same key and label.
func Open(key []byte, label string, sealed []byte) ([]byte, error) {
	aead, err := gcm(key)
	if err != nil {
		return nil, err
	}
	n := aead.NonceSize()
	if len(sealed) < n+aead.Overhead() {
		return nil, errors.New("secrets: sealed value too short")
	}
	v, err := aead.Open(nil, sealed[:n], sealed[n:], []byte(label))
	if err != nil {
		return nil, fmt.Errorf("secrets: %s does not open under the data key: %w", label, err)
	}
	return v, nil
}

func gcm(key []byte) (cipher.AEAD, error) {
	if len(key) != DataKeySize {
		return nil, fmt.Errorf("secrets: data key of %d bytes, want %d", len(key), DataKeySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
