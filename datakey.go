package harebox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"

	"filippo.io/age"

	"github.com/harebox/harebox/guestenv"
	"github.com/harebox/harebox/hypervisor/consolelog"
	"github.com/harebox/harebox/secrets"
)

// Crypto-erase. Every sandbox gets its own data key when it is created,
// kept only in the secret store (sealed under the host's master key). The
// backend encrypts the sandbox's disk overlay and memory snapshots under
// it; the engine seals the sandbox's stored env and command history under
// it. Delete destroys the key first, so what is left of the sandbox on the
// host, if anything, is ciphertext without a key.
//
// A sandbox created before data keys existed has none (key nil): its
// disk is plain and its env and history are sealed by the master key only.

// newDataKey makes the sandbox's data key and its console identity, when
// crypto-erase is on.
func (e *Engine) newDataKey(ctx context.Context, b *box) error {
	if !e.encrypt {
		return nil
	}
	k := make([]byte, secrets.DataKeySize)
	if _, err := rand.Read(k); err != nil {
		return err
	}
	id, err := consolelog.NewIdentity()
	if err != nil {
		return err
	}
	return e.keepKeys(ctx, b, k, id)
}

// keepKeys stores k as the sandbox's data key and id, sealed under it, as
// its console identity (a pool member's were made before it was claimed).
func (e *Engine) keepKeys(ctx context.Context, b *box, k []byte, id *age.X25519Identity) error {
	if err := secrets.KeepDataKey(ctx, e.sec, guestenv.Scope(b.rec.ID), k); err != nil {
		return err
	}
	b.key = k
	sealed, err := seal(k, consoleKeyName, []byte(id.String()))
	if err != nil {
		return err
	}
	if err := e.sec.Put(ctx, guestenv.Scope(b.rec.ID), consoleKeyName, sealed); err != nil {
		return err
	}
	b.console = id
	return nil
}

// consoleKeyName is the secret holding the identity that reads the
// sandbox's console log (the backend only gets its public recipient).
const consoleKeyName = "console-key"

// eraseConsoleKey removes the sandbox's stored console identity (sealed
// under its data key, erased before it).
func (e *Engine) eraseConsoleKey(ctx context.Context, id string) error {
	if err := e.sec.Delete(ctx, guestenv.Scope(id), consoleKeyName); err != nil && !errors.Is(err, secrets.ErrNotFound) {
		return err
	}
	return nil
}

// loadKeys finds an adopted sandbox's data key and console identity.
func (e *Engine) loadKeys(ctx context.Context, b *box) error {
	k, err := e.dataKey(ctx, b.rec.ID)
	if err != nil || k == nil {
		return err
	}
	b.key = k
	sealed, err := e.sec.Get(ctx, guestenv.Scope(b.rec.ID), consoleKeyName)
	if errors.Is(err, secrets.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	raw, err := open(k, consoleKeyName, sealed)
	if err != nil {
		return err
	}
	id, err := age.ParseX25519Identity(string(raw))
	if err != nil {
		return fmt.Errorf("console identity: %w", err)
	}
	b.console = id
	return nil
}

// consoleTail is the last n bytes of the sandbox's console log, for error
// messages.
func consoleTail(b *box, n int) string {
	if b.console == nil {
		return serialTail(b.rec.StateDir, n)
	}
	out, err := consolelog.Tail(serialLog(b.rec.StateDir), b.console, n)
	if err != nil {
		return "(console log: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}

// dataKey returns a sandbox's data key: the live box's, or the stored
// one; nil for a sandbox without one.
func (e *Engine) dataKey(ctx context.Context, id string) ([]byte, error) {
	if b := e.boxes.get(id); b != nil && b.key != nil {
		return b.key, nil
	}
	k, err := secrets.DataKey(ctx, e.sec, guestenv.Scope(id))
	if errors.Is(err, secrets.ErrNotFound) {
		return nil, nil
	}
	return k, err
}

// eraseDataKey destroys the sandbox's stored data key. (The box's copy in
// memory goes with the box: clearing it here would race with an exec
// still recording its history.)
func (e *Engine) eraseDataKey(ctx context.Context, b *box) error {
	return secrets.EraseDataKey(ctx, e.sec, guestenv.Scope(b.rec.ID))
}

// seal and open protect a value of the sandbox's under its data key (label
// says what it is); without a key the value passes as is, for the secret
// store's master-key sealing alone.
func seal(key []byte, label string, v []byte) ([]byte, error) {
	if key == nil {
		return v, nil
	}
	return secrets.Seal(key, label, v)
}

func open(key []byte, label string, v []byte) ([]byte, error) {
	if key == nil {
		return v, nil
	}
	return secrets.Open(key, label, v)
}
