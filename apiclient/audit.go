package apiclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/url"
	"strconv"

	"github.com/harebox/harebox/model"
)

// AuditEntry is one entry of the audit log: who (Principal: a key ID, or
// "operator") did what (Action, an operationId, on Target) from where, and
// how it ended (Outcome "ok", "denied" or "error"; Error its code); it is
// model.AuditEntry.
type AuditEntry = model.AuditEntry

// AuditList is a page of entries; Next, set when the page is full, is the
// cursor (after=) of the next page.
type AuditList struct {
	Entries []AuditEntry `json:"entries"`
	Next    string       `json:"next,omitempty"`
}

// AuditReport is what verifying the log found: FirstBad is the first entry
// altered, removed or reordered when OK is false, and Reason says how.
type AuditReport struct {
	OK          bool   `json:"ok"`
	Entries     int64  `json:"entries"`
	Checkpoints int    `json:"checkpoints"`
	FirstBad    int64  `json:"first_bad,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// Anchor is where the checkpoints are also kept ("none" if nowhere),
	// Anchored the newest entry it vouches for, Unanchored how many follow.
	Anchor     string `json:"anchor"`
	Anchored   int64  `json:"anchored"`
	Unanchored int64  `json:"unanchored"`
}

// AuditKey is the public key that verifies the log's signed checkpoints.
type AuditKey struct {
	Algorithm string `json:"algorithm"`
	PublicKey string `json:"public_key"`
}

// AuditFilter is the query of listAudit; zero fields are left out.
type AuditFilter struct {
	From, To                                           string // RFC 3339
	Principal, Target, Action, Outcome, Account, After string
	Limit                                              int
	// Newest takes the last Limit entries that match rather than the
	// first.
	Newest bool
}

// Query is the filter as a query string.
func (f AuditFilter) Query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"from": f.From, "to": f.To, "principal": f.Principal, "target": f.Target,
		"action": f.Action, "outcome": f.Outcome, "account": f.Account, "after": f.After} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if f.Limit > 0 {
		q.Set("limit", fmt.Sprint(f.Limit))
	}
	if f.Newest {
		q.Set("newest", "true")
	}
	return q
}

// FollowAudit calls fn with each entry of the audit log that matches f:
// first what the list answers (with f.Newest, the last f.Limit), then
// each later one as it is appended, until ctx ends, fn fails or the
// server ends the stream with an error (a revoked key's: an *Error). The
// server ends every stream after some minutes: it is opened again after
// the last entry seen.
func (c *Client) FollowAudit(ctx context.Context, f AuditFilter, fn func(AuditEntry) error) error {
	query := func() url.Values {
		q := f.Query()
		q.Set("follow", "true")
		f.Newest = false // (opened again: on from where it ended)
		return q
	}
	return c.follow(ctx, "/v1/audit", query, func(_ string, data []byte) error {
		var e AuditEntry
		if err := json.Unmarshal(data, &e); err != nil {
			return fmt.Errorf("audit: an entry the server sent: %w", err)
		}
		f.After = strconv.FormatInt(e.Seq, 10)
		return fn(e)
	})
}

// ExportAudit writes every entry that matches f to w as JSON Lines, as the
// server streams them (f.Limit is not sent: the export has no pages). It
// has no deadline of its own: a long log takes as long as it takes, and
// ctx stops it.
func (c *Client) ExportAudit(ctx context.Context, f AuditFilter, w io.Writer) error {
	q := f.Query()
	q.Del("limit")
	q.Set("format", "jsonl")
	resp, err := c.send(ctx, "GET", Path("audit"), q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); ct != "application/x-ndjson" {
		return fmt.Errorf("the server answered %q, not JSON Lines (application/x-ndjson)", resp.Header.Get("Content-Type"))
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("audit export: %w", err)
	}
	return nil
}
