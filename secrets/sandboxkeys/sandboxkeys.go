// Package sandboxkeys holds a sandbox's keys, for crypto-erase: its data
// key and its console identity, kept only in the secret store (which
// seals them under the host's master key) in the sandbox's scope.
//
// The backend encrypts the sandbox's disk overlay and memory snapshots
// under the data key; the engine and the domains seal the console
// identity, the sandbox's own env and its command history under it with
// Seal before the secret store seals the row. Delete erases the data key
// first, so what is left of the sandbox on the host, if anything, is
// ciphertext without a key.
//
// A sandbox created before data keys existed, or with crypto-erase off,
// has none (Keys.Data nil): its disk is plain, and Seal and Open pass its
// values as they are, for the secret store's master-key sealing alone.
package sandboxkeys

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"filippo.io/age"

	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/secrets"
)

// Keys are a sandbox's keys; the zero value is a sandbox without any.
type Keys struct {
	// Data is its data key (secrets.DataKeySize bytes); nil: none.
	Data []byte
	// Console is the identity that reads its console log (the backend
	// only gets its public recipient); nil: a plain console log.
	Console *age.X25519Identity
}

// ConsoleKeyName is the secret holding the console identity, sealed
// under the data key.
const ConsoleKeyName = "console-key"

// Scope is a sandbox's scope in the secret store: its keys are kept
// there, and package guestenv keeps the create request's own env and the
// sandbox's CA key there; all of it goes with the sandbox.
func Scope(sandboxID string) string { return "sandbox/" + sandboxID }

// New makes a sandbox's keys: a random data key and a console identity.
func New() (Keys, error) {
	k := make([]byte, secrets.DataKeySize)
	if _, err := rand.Read(k); err != nil {
		return Keys{}, err
	}
	id, err := consolelog.NewIdentity()
	if err != nil {
		return Keys{}, err
	}
	return Keys{Data: k, Console: id}, nil
}

// Keep stores k as the sandbox's keys: the data key, and the console
// identity sealed under it.
func Keep(ctx context.Context, s secrets.Store, sandboxID string, k Keys) error {
	if err := secrets.KeepDataKey(ctx, s, Scope(sandboxID), k.Data); err != nil {
		return err
	}
	if k.Console == nil {
		return nil
	}
	sealed, err := Seal(k.Data, ConsoleKeyName, []byte(k.Console.String()))
	if err != nil {
		return err
	}
	return s.Put(ctx, Scope(sandboxID), ConsoleKeyName, sealed)
}

// Load finds a sandbox's stored keys: none (the zero Keys) for a sandbox
// without a data key; no console identity for one that has none stored.
// When the console identity does not load, the data key still comes
// with the error: what the sandbox stores stays sealed under it.
func Load(ctx context.Context, s secrets.Store, sandboxID string) (Keys, error) {
	k, err := DataKey(ctx, s, sandboxID)
	if err != nil || k == nil {
		return Keys{}, err
	}
	keys := Keys{Data: k}
	sealed, err := s.Get(ctx, Scope(sandboxID), ConsoleKeyName)
	if errors.Is(err, secrets.ErrNotFound) {
		return keys, nil
	}
	if err != nil {
		return keys, err
	}
	raw, err := Open(k, ConsoleKeyName, sealed)
	if err != nil {
		return keys, err
	}
	id, err := age.ParseX25519Identity(string(raw))
	if err != nil {
		return keys, fmt.Errorf("console identity: %w", err)
	}
	keys.Console = id
	return keys, nil
}

// DataKey returns a sandbox's stored data key; nil for a sandbox without
// one (it predates data keys, or it was erased).
func DataKey(ctx context.Context, s secrets.Store, sandboxID string) ([]byte, error) {
	k, err := secrets.DataKey(ctx, s, Scope(sandboxID))
	if errors.Is(err, secrets.ErrNotFound) {
		return nil, nil
	}
	return k, err
}

// Erase destroys a sandbox's stored data key (crypto-erase); a missing
// one is no error. What was sealed under it stays unreadable, the
// console identity with it, which Forget removes.
func Erase(ctx context.Context, s secrets.Store, sandboxID string) error {
	return secrets.EraseDataKey(ctx, s, Scope(sandboxID))
}

// Erased reports whether a sandbox's data key was erased by a delete
// that did not finish (an engine that died in it): its console identity,
// which the delete removes only after the key, is still stored. A sandbox
// that never had keys (crypto-erase off, or from before data keys) has
// neither, and is not erased.
func Erased(ctx context.Context, s secrets.Store, sandboxID string) (bool, error) {
	if _, err := s.Get(ctx, Scope(sandboxID), ConsoleKeyName); errors.Is(err, secrets.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	_, err := secrets.DataKey(ctx, s, Scope(sandboxID))
	if errors.Is(err, secrets.ErrNotFound) {
		return true, nil
	}
	return false, err
}

// Forget removes a sandbox's stored console identity (sealed under its
// data key, erased before it); a missing one is no error.
func Forget(ctx context.Context, s secrets.Store, sandboxID string) error {
	if err := s.Delete(ctx, Scope(sandboxID), ConsoleKeyName); err != nil && !errors.Is(err, secrets.ErrNotFound) {
		return err
	}
	return nil
}

// Seal protects a value under a data key (a sandbox's or a snapshot's;
// label says what the value is); without a key the value passes as is,
// for the secret store's master-key sealing alone.
func Seal(key []byte, label string, v []byte) ([]byte, error) {
	if key == nil {
		return v, nil
	}
	return secrets.Seal(key, label, v)
}

// Open reads what Seal made under the same key and label; without a key
// the value passes as is.
func Open(key []byte, label string, v []byte) ([]byte, error) {
	if key == nil {
		return v, nil
	}
	return secrets.Open(key, label, v)
}
