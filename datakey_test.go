package harebox_test

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/store"
)

// TestDataKeys: a sandbox's stored env and command history are sealed
// under its own data key, which survives an engine restart and is
// destroyed by delete; PlaintextDisks turns it off; a backend that cannot
// encrypt is refused without it. (The disk side runs on real VMs in
// TestEngineDefaultImage and the backends' conformance suite.)
func TestDataKeys(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	const value = "sk-canary-3f9d1c"
	box, err := eng.Create(ctx, sandbox.CreateRequest{Env: map[string]string{"TOKEN": value}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Exec(ctx, box.ID, sandbox.ExecRequest{Cmd: "echo " + value}); err != nil {
		t.Fatal(err)
	}
	eng.Close()

	// Read the rows as someone holding the master key (but not the data
	// key) would.
	db, err := store.OpenSQLite(ctx, filepath.Join(opts.DataDir, "harebox.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	master, err := secrets.NewSealed(db, filepath.Join(opts.DataDir, "master.key"))
	if err != nil {
		t.Fatal(err)
	}
	scope := "sandbox/" + box.ID
	key, err := secrets.DataKey(ctx, master, scope)
	if err != nil {
		t.Fatal("no data key:", err)
	}
	env, err := master.Get(ctx, scope, "env")
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(env, []byte(value)) {
		t.Fatal("the stored env is readable with the master key alone")
	}
	if plain, err := secrets.Open(key, "env", env); err != nil || !bytes.Contains(plain, []byte(value)) {
		t.Fatalf("the stored env does not open under the data key: %q %v", plain, err)
	}

	// After a restart the key is found again: history still reads.
	eng, err = harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { eng.Close() }()
	cmds, err := eng.History().List(ctx, box.ID, 0)
	if err != nil || len(cmds) != 1 || cmds[0].Result == nil || cmds[0].Result.Stdout != value+"\n" {
		t.Fatalf("history after a restart: %+v %v", cmds, err)
	}
	if err := eng.Delete(ctx, box.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.DataKey(ctx, master, scope); !errors.Is(err, secrets.ErrNotFound) {
		t.Errorf("the data key outlived the sandbox: %v", err)
	}
	eng.Close()

	// Crypto-erase off: no data key.
	opts.PlaintextDisks = true
	eng, err = harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.DataKey(ctx, master, "sandbox/"+plain.ID); !errors.Is(err, secrets.ErrNotFound) {
		t.Errorf("PlaintextDisks: a data key was made (%v)", err)
	}
	eng.Delete(ctx, plain.ID)
	eng.Close()

	// A backend that cannot encrypt needs PlaintextDisks.
	opts.PlaintextDisks = false
	opts.Hypervisor = noEncryption{hv}
	if eng, err = harebox.New(ctx, opts); !errors.Is(err, sandbox.ErrUnavailable) {
		if err == nil {
			eng.Close()
		}
		t.Fatalf("a backend without encryption: %v, want ErrUnavailable", err)
	}
	opts.PlaintextDisks = true
	if eng, err = harebox.New(ctx, opts); err != nil {
		t.Fatalf("a backend without encryption and PlaintextDisks: %v", err)
	}
}

// noEncryption is memhv reporting that it cannot encrypt, as Cloud
// Hypervisor does without root, qemu-img or qemu-storage-daemon.
type noEncryption struct{ *memhv.Hypervisor }

func (n noEncryption) Capabilities(ctx context.Context) (hypervisor.Capabilities, error) {
	c, err := n.Hypervisor.Capabilities(ctx)
	c.Encryption = false
	return c, err
}
