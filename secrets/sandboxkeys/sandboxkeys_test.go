package sandboxkeys_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
	"github.com/harebox/harebox/store"
)

// openSealed is the engine's secret store: Sealed over a SQLite database,
// both in a test directory.
func openSealed(t *testing.T) *secrets.Sealed {
	t.Helper()
	dir := t.TempDir()
	db, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := secrets.NewSealed(db, filepath.Join(dir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestKeys: a sandbox's keys are kept and load again; its console
// identity is stored sealed under its data key; a value sealed under the
// data key opens only under it and its label; after Erase and Forget
// nothing of the keys loads, and what was sealed under the data key
// stays unreadable to someone holding the master key.
func TestKeys(t *testing.T) {
	ctx := context.Background()
	sec := openSealed(t)
	id := sandbox.NewID()
	keys, err := sandboxkeys.New()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys.Data) != secrets.DataKeySize || keys.Console == nil {
		t.Fatalf("new keys: %d-byte data key, console %v", len(keys.Data), keys.Console)
	}
	if err := sandboxkeys.Keep(ctx, sec, id, keys); err != nil {
		t.Fatal(err)
	}
	got, err := sandboxkeys.Load(ctx, sec, id)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Data, keys.Data) || got.Console == nil || got.Console.String() != keys.Console.String() {
		t.Fatal("the loaded keys are not the kept ones")
	}
	if k, err := sandboxkeys.DataKey(ctx, sec, id); err != nil || !bytes.Equal(k, keys.Data) {
		t.Fatalf("data key: %v", err)
	}

	// The console identity is sealed under the data key, not by the
	// master key alone.
	row, err := sec.Get(ctx, sandboxkeys.Scope(id), sandboxkeys.ConsoleKeyName)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(row, []byte(keys.Console.String())) {
		t.Fatal("the console identity is readable with the master key alone")
	}

	// A value of the sandbox's, sealed under its data key and stored.
	const value = "sk-canary-sandboxkeys-41c7"
	sealed, err := sandboxkeys.Seal(keys.Data, "env", []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(sealed, []byte(value)) {
		t.Fatal("the sealed value holds the plaintext")
	}
	if err := sec.Put(ctx, sandboxkeys.Scope(id), "env", sealed); err != nil {
		t.Fatal(err)
	}
	if v, err := sandboxkeys.Open(keys.Data, "env", sealed); err != nil || string(v) != value {
		t.Fatalf("open: %q %v", v, err)
	}
	if _, err := sandboxkeys.Open(keys.Data, "history", sealed); err == nil {
		t.Fatal("a value opened under another label")
	}
	other, err := sandboxkeys.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sandboxkeys.Open(other.Data, "env", sealed); err == nil {
		t.Fatal("a value opened under another sandbox's data key")
	}

	// Erase: the data key is gone, the console identity with it.
	if err := sandboxkeys.Erase(ctx, sec, id); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.DataKey(ctx, sec, sandboxkeys.Scope(id)); !errors.Is(err, secrets.ErrNotFound) {
		t.Fatalf("the data key after Erase: %v", err)
	}
	if got, err := sandboxkeys.Load(ctx, sec, id); err != nil || got.Data != nil || got.Console != nil {
		t.Fatalf("keys after Erase: %+v %v", got, err)
	}
	raw, err := sec.Get(ctx, sandboxkeys.Scope(id), "env")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(value)) {
		t.Fatal("the stored value is readable with the master key alone after Erase")
	}
	if v, err := sandboxkeys.Open(nil, "env", raw); err != nil || bytes.Contains(v, []byte(value)) {
		t.Fatalf("without the key the stored value reads %q (%v)", v, err)
	}
	if err := sandboxkeys.Forget(ctx, sec, id); err != nil {
		t.Fatal(err)
	}
	if _, err := sec.Get(ctx, sandboxkeys.Scope(id), sandboxkeys.ConsoleKeyName); !errors.Is(err, secrets.ErrNotFound) {
		t.Fatalf("the console identity after Forget: %v", err)
	}
	// Both again are no error (a delete that is retried).
	if err := sandboxkeys.Erase(ctx, sec, id); err != nil {
		t.Fatal(err)
	}
	if err := sandboxkeys.Forget(ctx, sec, id); err != nil {
		t.Fatal(err)
	}
}

// TestWithoutKey: a sandbox without a data key (crypto-erase off, or one
// from before data keys) has no keys, and its values pass as they are.
func TestWithoutKey(t *testing.T) {
	ctx := context.Background()
	sec := openSealed(t)
	id := sandbox.NewID()
	if got, err := sandboxkeys.Load(ctx, sec, id); err != nil || got.Data != nil || got.Console != nil {
		t.Fatalf("keys of a sandbox without any: %+v %v", got, err)
	}
	if k, err := sandboxkeys.DataKey(ctx, sec, id); err != nil || k != nil {
		t.Fatalf("data key of a sandbox without one: %x %v", k, err)
	}
	v := []byte("plain value")
	sealed, err := sandboxkeys.Seal(nil, "env", v)
	if err != nil || !bytes.Equal(sealed, v) {
		t.Fatalf("seal without a key: %q %v", sealed, err)
	}
	opened, err := sandboxkeys.Open(nil, "env", sealed)
	if err != nil || !bytes.Equal(opened, v) {
		t.Fatalf("open without a key: %q %v", opened, err)
	}
	if err := sandboxkeys.Erase(ctx, sec, id); err != nil {
		t.Fatal(err)
	}
	if err := sandboxkeys.Forget(ctx, sec, id); err != nil {
		t.Fatal(err)
	}
}

// TestLoadBrokenConsole: a console identity that does not open is an
// error, and the data key still loads with it (the sandbox's values stay
// sealed under it).
func TestLoadBrokenConsole(t *testing.T) {
	ctx := context.Background()
	sec := openSealed(t)
	id := sandbox.NewID()
	keys, err := sandboxkeys.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := sandboxkeys.Keep(ctx, sec, id, keys); err != nil {
		t.Fatal(err)
	}
	if err := sec.Put(ctx, sandboxkeys.Scope(id), sandboxkeys.ConsoleKeyName, []byte("not sealed under the data key")); err != nil {
		t.Fatal(err)
	}
	got, err := sandboxkeys.Load(ctx, sec, id)
	if err == nil {
		t.Fatal("a console identity that does not open loaded")
	}
	if !bytes.Equal(got.Data, keys.Data) || got.Console != nil {
		t.Fatalf("keys with a broken console identity: %+v", got)
	}
}
