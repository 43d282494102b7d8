package audit_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/store"
)

// crashDirEnv, set, makes the test binary the process that TestKill9
// kills: it appends to the log in that directory, says "ready", and waits.
const crashDirEnv = "HAREBOX_AUDIT_CRASH_DIR"

// The time bound of the checkpoints in the killed process: longer than
// its first appends take, shorter than the test's patience.
const crashInterval = 2 * time.Second

func TestMain(m *testing.M) {
	if dir := os.Getenv(crashDirEnv); dir != "" {
		if err := crashChild(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		select {} // until killed
	}
	os.Exit(m.Run())
}

// crashChild appends CheckpointEvery+10 entries (a checkpoint by count),
// waits for the time bound to sign the 10 more, and appends 3 that no
// checkpoint covers when it is killed (well before the time bound).
func crashChild(dir string) error {
	ctx := context.Background()
	db, err := store.OpenSQLite(ctx, filepath.Join(dir, "h.db"))
	if err != nil {
		return err
	}
	a, err := audit.OpenFileAnchor(filepath.Join(dir, "audit.anchor"))
	if err != nil {
		return err
	}
	l, err := audit.Open(ctx, db, audit.Options{KeyFile: filepath.Join(dir, "audit.key"), Log: slog.New(slog.NewTextHandler(os.Stderr, nil)),
		Anchor: a, Interval: crashInterval})
	if err != nil {
		return err
	}
	op := authz.WithPrincipal(ctx, authz.Operator)
	for i := range audit.CheckpointEvery + 10 {
		l.Record(op, "createProject", "", fmt.Sprintf("prj_%d", i), nil)
	}
	// The time bound signs the 10 past the count's checkpoint.
	for deadline := time.Now().Add(5 * crashInterval); ; time.Sleep(20 * time.Millisecond) {
		cps, err := a.Checkpoints(ctx)
		if err != nil {
			return err
		}
		if n := len(cps); n > 0 && cps[n-1].Seq == audit.CheckpointEvery+10 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no checkpoint of entry %d within %v: %d lines", audit.CheckpointEvery+10, 5*crashInterval, len(cps))
		}
	}
	for i := range 3 {
		l.Record(op, "deleteProject", "", fmt.Sprintf("prj_%d", i), nil)
	}
	fmt.Println("ready")
	return nil
}

// After a kill -9 the log verifies, and the entries past the last anchored
// checkpoint are counted, not an error: the checkpoints by count and by
// time both reached the anchor. A tail then cut back behind the anchor,
// checkpoints and all, is reported.
func TestKill9(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill() // (if the test fails before the kill)
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "ready" {
			t.Fatalf("the child said %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the child did not get ready")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a, err := audit.OpenFileAnchor(filepath.Join(dir, "audit.anchor"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	l, err := audit.Open(ctx, st, audit.Options{KeyFile: filepath.Join(dir, "audit.key"), Anchor: a})
	if err != nil {
		t.Fatal(err)
	}
	op := authz.WithPrincipal(ctx, authz.Operator)
	r, err := l.Verify(op)
	if err != nil {
		t.Fatal(err)
	}
	const total = audit.CheckpointEvery + 13
	if !r.OK || r.Entries != total || r.Anchored != total-3 || r.Unanchored != 3 {
		t.Fatalf("after kill -9: %+v, want %d entries, %d anchored and 3 past the anchor", r, total, total-3)
	}
	cps, _ := a.Checkpoints(ctx)
	if len(cps) != 2 || cps[0].Seq != audit.CheckpointEvery {
		t.Fatalf("anchored: %+v, want one checkpoint by count and one by time", cps)
	}

	// Cut back to entry 260, with the checkpoints after it: the anchor
	// remembers 266.
	raw, err := sql.Open("sqlite", filepath.Join(dir, "h.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	for _, q := range []string{`DELETE FROM audit_log WHERE seq > 260`, `DELETE FROM audit_checkpoints WHERE seq > 260`} {
		if _, err := raw.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := l.Verify(op); err != nil || r.OK || r.FirstBad != 261 {
		t.Fatalf("the tail cut behind the anchor: %+v %v", r, err)
	}
}
