package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
)

// Changes that must reach every host at once (a key revoked) go through
// the store: on PostgreSQL as NOTIFY on one channel, delivered by the
// server when the transaction commits to every session that LISTENs, the
// host's own included; on SQLite (one host) in process, after the commit.

// pgChannel is the channel every host LISTENs on.
const pgChannel = "harebox"

// maxNotice bounds a notice's topic and payload (PostgreSQL's limit for a
// NOTIFY payload is 8000 bytes).
const maxNotice = 4000

// notice is one change.
type notice struct{ topic, payload string }

// hub delivers a SQLite store's notices to its listeners.
type hub struct {
	mu        sync.Mutex
	listeners map[*listener]bool
}

// listener gets notices in order, one call at a time; one that falls
// behind by more than its buffer gets "" (changes were missed) instead.
type listener struct {
	c      chan notice
	missed chan struct{}
}

func (h *hub) publish(ns []notice) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for l := range h.listeners {
		for _, n := range ns {
			select {
			case l.c <- n:
			default:
				select {
				case l.missed <- struct{}{}:
				default:
				}
			}
		}
	}
}

// Notify implements Tx.
func (s *DB) Notify(ctx context.Context, topic, payload string) error {
	if topic == "" || strings.ContainsRune(topic, ' ') || len(topic)+len(payload) > maxNotice {
		return fmt.Errorf("store: notify: a topic (no spaces) and payload of at most %d bytes", maxNotice)
	}
	if s.pg {
		if _, err := s.q.ExecContext(ctx, `SELECT pg_notify(?, ?)`, pgChannel, topic+" "+payload); err != nil {
			return fmt.Errorf("store: notify: %w", err)
		}
		return nil
	}
	if s.pending != nil { // in a transaction: delivered after its commit
		*s.pending = append(*s.pending, notice{topic, payload})
		return nil
	}
	s.hub.publish([]notice{{topic, payload}})
	return nil
}

// Listen implements Store.
func (s *DB) Listen(ctx context.Context, fn func(topic, payload string)) {
	if s.pg {
		ready := make(chan struct{})
		go s.pgListen(ctx, ready, fn)
		<-ready
		return
	}
	l := &listener{c: make(chan notice, 256), missed: make(chan struct{}, 1)}
	s.hub.mu.Lock()
	s.hub.listeners[l] = true
	s.hub.mu.Unlock()
	go func() {
		defer func() {
			s.hub.mu.Lock()
			delete(s.hub.listeners, l)
			s.hub.mu.Unlock()
		}()
		for {
			select {
			case <-ctx.Done():
				return
			case n := <-l.c:
				fn(n.topic, n.payload)
			case <-l.missed:
				fn("", "")
			}
		}
	}()
}

// pgListen LISTENs on a connection of its own until ctx ends, and on a
// new one after it loses one (telling fn that changes may have been
// missed meanwhile). It closes ready once the first try LISTENs or
// fails: a notice committed after Listen returned is then not missed
// unseen (a host that has just started pauses for a budget another one
// reached, however soon after).
func (s *DB) pgListen(ctx context.Context, ready chan struct{}, fn func(topic, payload string)) {
	var once sync.Once
	for lost := false; ; lost = true {
		err := s.pgListenOnce(ctx, func() {
			once.Do(func() { close(ready) })
			if lost {
				fn("", "")
			}
		}, fn)
		once.Do(func() { close(ready) })
		if ctx.Err() != nil {
			return
		}
		_ = err // (the database is unreachable: tried again)
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (s *DB) pgListenOnce(ctx context.Context, listening func(), fn func(topic, payload string)) error {
	c, err := s.db.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	return c.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errors.New("store: listen: not a pgx connection")
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, "LISTEN "+pgChannel); err != nil {
			return driver.ErrBadConn
		}
		listening()
		for {
			n, err := pc.WaitForNotification(ctx)
			if err != nil {
				// (The session LISTENs: it must not go back to the pool.)
				return driver.ErrBadConn
			}
			topic, payload, _ := strings.Cut(n.Payload, " ")
			fn(topic, payload)
		}
	})
}
