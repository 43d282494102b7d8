package store

import (
	"context"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testpg"
)

// On PostgreSQL a notice reaches the listeners of every store on the
// database (the other hosts); a listener whose connection dies listens
// again on another, and says that it may have missed changes.
func TestPostgresNotices(t *testing.T) {
	dsn := testpg.Database(t, pg, pgErr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type got struct{ topic, payload string }
	var listeners []chan got
	var stores []*DB
	for range 2 {
		s, err := OpenPostgres(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		c := make(chan got, 16)
		s.Listen(ctx, func(topic, payload string) { c <- got{topic, payload} })
		stores, listeners = append(stores, s), append(listeners, c)
	}
	time.Sleep(200 * time.Millisecond) // (the LISTENs are on their way)
	expect := func(want got) {
		t.Helper()
		for i, c := range listeners {
			select {
			case g := <-c:
				if g != want {
					t.Fatalf("listener %d: %+v, want %+v", i, g, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("listener %d: no notice %+v", i, want)
			}
		}
	}
	if err := stores[0].Update(ctx, func(tx Tx) error { return tx.Notify(ctx, "key", "k1") }); err != nil {
		t.Fatal(err)
	}
	expect(got{"key", "k1"})
	if _, err := stores[0].db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = 'LISTEN harebox' AND pid <> pg_backend_pid()`); err != nil {
		t.Fatal(err)
	}
	expect(got{}) // (changes may have been missed)
	if err := stores[1].Notify(ctx, "key", "again"); err != nil {
		t.Fatal(err)
	}
	expect(got{"key", "again"})
}
