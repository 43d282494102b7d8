package secrets

import (
	"bytes"
	"context"
	"crypto/cipher"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/harebox/harebox/store"
)

// openSealed opens a database (state.db) and a Sealed store over it with
// a new master key (master.key), both in a test directory.
func openSealed(t *testing.T) (dir string, db *store.DB, s *Sealed) {
	t.Helper()
	dir = t.TempDir()
	db, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if s, err = NewSealed(db, filepath.Join(dir, "master.key")); err != nil {
		t.Fatal(err)
	}
	return dir, db, s
}

func TestSealed(t *testing.T) {
	ctx := context.Background()
	dir, db, s := openSealed(t)
	keyFile := filepath.Join(dir, "master.key")
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("master key file: %v %v", fi.Mode(), err)
	}
	secret := []byte("sk-live-123")
	if err := s.Put(ctx, "env:prod", "API_KEY", secret); err != nil {
		t.Fatal(err)
	}
	raw, _ := db.GetSecret(ctx, "env:prod", "API_KEY")
	if bytes.Contains(raw, secret) {
		t.Fatal("the database holds the plaintext")
	}
	// A reopened store with the same key reads it back.
	s2, err := NewSealed(db, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s2.Get(ctx, "env:prod", "API_KEY"); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("got %q %v", got, err)
	}
	// A sealed value moved to another row does not decrypt.
	db.PutSecret(ctx, "env:dev", "API_KEY", raw)
	if _, err := s.Get(ctx, "env:dev", "API_KEY"); err == nil {
		t.Fatal("a value copied to another scope decrypted")
	}
	if err := s.Delete(ctx, "env:prod", "API_KEY"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "env:prod", "API_KEY"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	// Another key cannot read what this one sealed.
	os.WriteFile(filepath.Join(dir, "other.key"), bytes.Repeat([]byte{7}, 32), 0o600)
	s3, _ := NewSealed(db, filepath.Join(dir, "other.key"))
	if _, err := s3.Get(ctx, "env:dev", "API_KEY"); err == nil {
		t.Fatal("decrypted with the wrong master key")
	}
}

func TestDataKeys(t *testing.T) {
	ctx := context.Background()
	dir, db, s := openSealed(t)
	k, err := NewDataKey(ctx, s, "sandbox/a")
	if err != nil {
		t.Fatal(err)
	}
	got, err := DataKey(ctx, s, "sandbox/a")
	if err != nil || !bytes.Equal(got, k) {
		t.Fatalf("DataKey = %x, %v", got, err)
	}
	sealed, err := Seal(k, "env", []byte("TOKEN=1"))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := Open(k, "env", sealed); err != nil || string(v) != "TOKEN=1" {
		t.Fatalf("Open = %q, %v", v, err)
	}
	if _, err := Open(k, "history", sealed); err == nil {
		t.Error("a value opened under another label")
	}
	other, _ := NewDataKey(ctx, s, "sandbox/b")
	if _, err := Open(other, "env", sealed); err == nil {
		t.Error("a value opened under another scope's key")
	}
	wrapped, err := db.GetSecret(ctx, "sandbox/a", DataKeyName)
	if err != nil {
		t.Fatal(err)
	}
	if err := EraseDataKey(ctx, s, "sandbox/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := DataKey(ctx, s, "sandbox/a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("erased key: %v, want ErrNotFound", err)
	}
	// Erased means gone from the database's files too (secure_delete and
	// the WAL checkpoint), not only from its rows.
	files, _ := filepath.Glob(filepath.Join(dir, "state.db*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if bytes.Contains(b, wrapped) {
			t.Errorf("the erased key's sealed bytes are still in %s", f)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "state.db")); !bytes.Contains(b, []byte("sandbox/b")) {
		t.Error("the file scan would not find a row that is still there")
	}
	if err := EraseDataKey(ctx, s, "sandbox/a"); err != nil {
		t.Fatalf("erasing twice: %v", err)
	}
	if _, err := Seal(k[:16], "env", nil); err == nil {
		t.Error("a short key sealed")
	}
}

// TestMasterKeyShared: processes that start at once on one new key file
// (servers sharing it) all end with the key one of them wrote, whole.
func TestMasterKeyShared(t *testing.T) {
	file := filepath.Join(t.TempDir(), "master.key")
	aeads := make([]cipher.AEAD, 8)
	errs := make([]error, len(aeads))
	var wg sync.WaitGroup
	for i := range aeads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			aeads[i], errs[i] = MasterKey(file)
		}()
	}
	wg.Wait()
	nonce := make([]byte, aeads[0].NonceSize())
	sealed := aeads[0].Seal(nil, nonce, []byte("x"), nil)
	for i, a := range aeads {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if _, err := a.Open(nil, nonce, sealed, nil); err != nil {
			t.Fatalf("caller %d has another key", i)
		}
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o600 || fi.Size() != 32 {
		t.Fatalf("the key file: %v %v", fi, err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(file), ".master-key-*")); len(left) > 0 {
		t.Fatalf("left: %v", left)
	}
}

// TestSealWith: what SealWith seals opens only under its aead and ad; a
// value too short to hold a nonce is ErrDamaged, a changed one fails.
func TestSealWith(t *testing.T) {
	a, err := MasterKey(filepath.Join(t.TempDir(), "k"))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := SealWith(a, []byte("here"), []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if v, err := OpenWith(a, []byte("here"), sealed); err != nil || string(v) != "v" {
		t.Fatalf("open: %q %v", v, err)
	}
	if _, err := OpenWith(a, []byte("there"), sealed); err == nil {
		t.Fatal("opened under another ad")
	}
	if _, err := OpenWith(a, []byte("here"), sealed[:3]); !errors.Is(err, ErrDamaged) {
		t.Fatalf("a short value: %v", err)
	}
	sealed[len(sealed)-1] ^= 1
	if _, err := OpenWith(a, []byte("here"), sealed); err == nil {
		t.Fatal("a changed value opened")
	}
}
