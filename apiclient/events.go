package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"time"
)

// FollowEvents streams /v1/events?follow=true from query's after on,
// calling fn with each event's JSON as it comes, until ctx ends, fn fails
// or the server ends the stream with an error event (returned as an
// *Error). A stream the server ends without one (it does after a while,
// to authenticate the key again) is opened again after the last event's
// seq: nothing is missed or repeated.
func (c *Client) FollowEvents(ctx context.Context, query url.Values, fn func(event json.RawMessage) error) error {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	q.Set("follow", "true")
	return c.follow(ctx, "/v1/events", func() url.Values { return q }, func(name string, data []byte) error {
		if name != "event" {
			return nil // (for newer clients)
		}
		var e struct {
			Seq int64 `json:"seq"`
		}
		if err := json.Unmarshal(data, &e); err != nil || e.Seq <= 0 {
			return fmt.Errorf("events: an event the server sent has no seq: %.200q", data)
		}
		q.Set("after", strconv.FormatInt(e.Seq, 10))
		return fn(json.RawMessage(data))
	})
}

// follow reads the followed stream at path, calling fn with each event,
// and opens it again (with query's answer, which fn's cursor moved)
// whenever the server ends it without an error event, as it does after a
// while to authenticate the key again; until ctx ends, fn fails or an
// error event comes (returned as an *Error).
func (c *Client) follow(ctx context.Context, path string, query func() url.Values, fn func(event string, data []byte) error) error {
	for {
		opened := time.Now()
		resp, err := c.send(ctx, "GET", path, query(), nil)
		if err != nil {
			return err
		}
		err = scanSSE(resp.Body, 1<<20, fn)
		resp.Body.Close()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil {
			return err
		}
		if time.Since(opened) < time.Second {
			select { // (a server that ends streams at once is not hammered)
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
}
