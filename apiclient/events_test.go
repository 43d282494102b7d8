package apiclient_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"testing"

	"github.com/harebox/harebox/apiclient"
)

// FollowEvents opens the stream again after the last event it received
// when the server ends one, skips events of other names, and returns the
// error event's error.
func TestFollowEvents(t *testing.T) {
	var queries []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		queries = append(queries, r.URL.Query().Encode())
		w.Header().Set("Content-Type", "text/event-stream")
		switch len(queries) {
		case 1: // events, then the server's end of the stream
			fmt.Fprint(w, "event: event\ndata: {\"seq\": 7}\n\n: keepalive\n\nevent: newer\ndata: {}\n\nevent: event\ndata: {\"seq\": 8}\n\n")
		case 2: // none at all
		default:
			fmt.Fprint(w, "event: event\ndata: {\"seq\": 9}\n\nevent: error\ndata: {\"error\": {\"code\": \"unauthorized\", \"message\": \"revoked\"}}\n\n")
		}
	}))
	defer srv.Close()
	c, err := apiclient.New(srv.URL, "k")
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	err = c.FollowEvents(context.Background(), url.Values{"after": {"5"}, "account": {"a"}}, func(ev json.RawMessage) error {
		var e struct{ Seq int64 }
		json.Unmarshal(ev, &e)
		got = append(got, e.Seq)
		return nil
	})
	var ae *apiclient.Error
	if !errors.As(err, &ae) || ae.Code != "unauthorized" {
		t.Errorf("FollowEvents: %v", err)
	}
	if !slices.Equal(got, []int64{7, 8, 9}) {
		t.Errorf("events %v", got)
	}
	want := []string{"account=a&after=5&follow=true", "account=a&after=8&follow=true", "account=a&after=8&follow=true"}
	if !slices.Equal(queries, want) {
		t.Errorf("queries %q, want %q", queries, want)
	}
}
