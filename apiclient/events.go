package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
)

// FollowEvents streams /v1/events?follow=true from after on, calling fn
// with each event's JSON as it comes, until ctx ends, fn fails or the
// server ends the stream (with an error event, returned as an *Error).
func (c *Client) FollowEvents(ctx context.Context, query url.Values, fn func(event json.RawMessage) error) error {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	q.Set("follow", "true")
	resp, err := c.send(ctx, "GET", "/v1/events", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	err = scanSSE(resp.Body, 1<<20, func(_ string, data []byte) error { return fn(json.RawMessage(data)) })
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("events: the server ended the stream")
}
