package apikey

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/store"
)

// twoSessions opens the same SQLite file twice, as two hosts' stores,
// and returns a Sessions over each, on one clock.
func twoSessions(t *testing.T, o SessionOptions) (a, b *Sessions, path string) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "state.db")
	open := func() *Sessions {
		db, err := store.OpenSQLite(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return New(db, nil).Sessions(o)
	}
	return open(), open(), path
}

func TestSessions(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1e9, 0)
	a, b, path := twoSessions(t, SessionOptions{Lifetime: time.Hour, Idle: 10 * time.Minute, PerKey: 3, Now: func() time.Time { return now }})
	const secret = "hbk_secretsecretsecret"
	id, sess, err := a.Open(ctx, "key_a", secret)
	if err != nil || sess.Key != secret || sess.CSRF == "" || id == sess.CSRF || !wellFormed(id) || !sess.Expires.Equal(now.Add(time.Hour)) {
		t.Fatalf("Open: %q %+v %v", id, sess, err)
	}
	if !sess.CheckCSRF(sess.CSRF) || sess.CheckCSRF("") || sess.CheckCSRF(sess.CSRF[1:]) {
		t.Fatal("CheckCSRF")
	}
	// Another host finds it; an ID one character off, or not an ID at
	// all, finds nothing.
	if got, err := b.Get(ctx, id); err != nil || got.Key != secret || got.CSRF != sess.CSRF || !got.Expires.Equal(sess.Expires) {
		t.Fatalf("Get on another host: %+v %v", got, err)
	}
	flip := map[byte]byte{'0': '1'}[id[0]]
	if flip == 0 {
		flip = '0'
	}
	for _, bad := range []string{string(flip) + id[1:], id + "0", "", "../" + id[3:], strings.ToUpper(id)} {
		if _, err := a.Get(ctx, bad); !errors.Is(err, ErrSessionEnded) {
			t.Fatalf("Get(%q): %v", bad, err)
		}
	}
	// The store holds neither the key's secret, nor the CSRF token, nor
	// the ID.
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	wal, _ := os.ReadFile(path + "-wal")
	for _, s := range []string{secret, sess.CSRF, id} {
		if bytes.Contains(raw, []byte(s)) || bytes.Contains(wal, []byte(s)) {
			t.Fatalf("the database holds %q", s)
		}
	}

	// Used every 9 minutes it lives until its lifetime ends, not longer.
	for i := 0; i < 6; i++ {
		now = now.Add(9 * time.Minute)
		if _, err := []*Sessions{a, b}[i%2].Get(ctx, id); err != nil {
			t.Fatalf("ended after %d uses: %v", i, err)
		}
	}
	now = now.Add(7 * time.Minute) // 61 minutes after sign-in
	if _, err := a.Get(ctx, id); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("a session outlived its lifetime: %v", err)
	}
	// Idle for longer than Idle: ended.
	id, _, _ = a.Open(ctx, "key_a", secret)
	now = now.Add(10 * time.Minute)
	if _, err := b.Get(ctx, id); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("an idle session stayed open: %v", err)
	}
	// A sign-out on one host ends it on the other; twice is no error.
	id, _, _ = a.Open(ctx, "key_a", secret)
	if err := b.Close(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Get(ctx, id); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("a closed session: %v", err)
	}
	if err := a.Close(ctx, id); err != nil || a.Close(ctx, "nothing") != nil {
		t.Fatalf("close twice: %v", err)
	}

	// PerKey bounds a key's sessions (the one nearest its end goes), and
	// no other key's.
	other, _, _ := a.Open(ctx, "key_b", "hbk_other")
	old, _, _ := a.Open(ctx, "key_a", secret)
	now = now.Add(time.Minute)
	var ids []string
	for range 3 {
		id, _, err := b.Open(ctx, "key_a", secret)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if _, err := a.Get(ctx, old); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("the oldest session stayed past PerKey: %v", err)
	}
	for _, id := range append(ids, other) {
		if _, err := a.Get(ctx, id); err != nil {
			t.Fatalf("a newer session, or another key's, was dropped: %v", err)
		}
	}
}

// TestSessionSealed: a session's row opens only under its own ID: a
// payload moved to another session's row (by whoever can write the
// store) opens nothing.
func TestSessionSealed(t *testing.T) {
	ctx := context.Background()
	db, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ss := New(db, nil).Sessions(SessionOptions{})
	mine, _, err := ss.Open(ctx, "key_a", "hbk_mine")
	if err != nil {
		t.Fatal(err)
	}
	theirs, _, err := ss.Open(ctx, "key_b", "hbk_theirs")
	if err != nil {
		t.Fatal(err)
	}
	mh, _ := derive(mine)
	th, _ := derive(theirs)
	mrow, err := db.GetSession(ctx, mh)
	if err != nil {
		t.Fatal(err)
	}
	trow, err := db.GetSession(ctx, th)
	if err != nil {
		t.Fatal(err)
	}
	mrow.Sealed = trow.Sealed
	if err := db.PutSession(ctx, mrow); err != nil {
		t.Fatal(err)
	}
	if s, err := ss.Get(ctx, mine); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("a moved payload opened: %+v %v", s, err)
	}
	if s, err := ss.Get(ctx, theirs); err != nil || s.Key != "hbk_theirs" {
		t.Fatalf("the other session: %+v %v", s, err)
	}
}
