package apiclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/harebox/harebox/apiclient"
)

// FollowAudit opens the stream again after the last entry it received
// when the server ends one, and returns the error event's error.
func TestFollowAudit(t *testing.T) {
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		queries = append(queries, q.Encode())
		w.Header().Set("Content-Type", "text/event-stream")
		switch len(queries) {
		case 1: // the tail, then the server's end of the stream
			fmt.Fprint(w, "event: entry\ndata: {\"seq\": 7, \"action\": \"a\"}\n\n: keepalive\n\nevent: entry\ndata: {\"seq\": 8, \"action\": \"b\"}\n\n")
		default:
			fmt.Fprint(w, "event: entry\ndata: {\"seq\": 9, \"action\": \"c\"}\n\nevent: error\ndata: {\"error\": {\"code\": \"unauthorized\", \"message\": \"revoked\"}}\n\n")
		}
	}))
	defer srv.Close()
	c, err := apiclient.New(srv.URL, "k")
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	err = c.FollowAudit(context.Background(), apiclient.AuditFilter{Outcome: "denied", Limit: 2, Newest: true}, func(e apiclient.AuditEntry) error {
		got = append(got, e.Seq)
		return nil
	})
	var ae *apiclient.Error
	if !errors.As(err, &ae) || ae.Code != "unauthorized" {
		t.Errorf("FollowAudit: %v", err)
	}
	if !slices.Equal(got, []int64{7, 8, 9}) {
		t.Errorf("entries %v", got)
	}
	want := []string{"follow=true&limit=2&newest=true&outcome=denied", "after=8&follow=true&limit=2&outcome=denied"}
	if !slices.Equal(queries, want) {
		t.Errorf("queries %q, want %q", queries, want)
	}
}
