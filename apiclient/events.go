package apiclient

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
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
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			data := json.RawMessage(strings.TrimPrefix(line, "data: "))
			if event == "error" {
				var e struct {
					Error Error `json:"error"`
				}
				if err := json.Unmarshal(data, &e); err != nil {
					return fmt.Errorf("events: %w", err)
				}
				return &e.Error
			}
			if err := fn(data); err != nil {
				return err
			}
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("events: %w", err)
	}
	return fmt.Errorf("events: the server ended the stream")
}
