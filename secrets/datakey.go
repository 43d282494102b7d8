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
	return SealWith(aead, []byte(label), v)
}

// Open decrypts what Seal made under the same key and label.
func Open(key []byte, label string, sealed []byte) ([]byte, error) {
	aead, err := gcm(key)
	if err != nil {
		return nil, err
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, errors.New("secrets: sealed value too short")
	}
	v, err := OpenWith(aead, []byte(label), sealed)
	if err != nil {
		return nil, fmt.Errorf("secrets: %s does not open under the data key: %w", label, err)
	}
	return v, nil
}

// SealWith seals v under aead (the master key's, a data key's) with a
// new random nonce, which comes first in what it returns; ad binds it to
// its place.
func SealWith(aead cipher.AEAD, ad, v []byte) ([]byte, error) {
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, v, ad), nil
}

// ErrDamaged: a sealed value too short to hold its nonce.
var ErrDamaged = errors.New("secrets: sealed value damaged")

// OpenWith opens what SealWith made under the same aead and ad.
func OpenWith(aead cipher.AEAD, ad, sealed []byte) ([]byte, error) {
	n := aead.NonceSize()
	if len(sealed) < n {
		return nil, ErrDamaged
	}
	return aead.Open(nil, sealed[:n], sealed[n:], ad)
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
