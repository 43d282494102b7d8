// Package testweb is the web app tests run behind the ingress, in a guest
// (e2e/testdata/guestweb) or on loopback (the ingress's own tests).
package testweb

import (
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// NewMux serves: / the request it got (path, query, Host, headers) as
// JSON; /page an HTML page for a browser (blue, naming the request's
// headers); /big 8 MiB; /sse an event every sseEvery, each saying when it
// was written (Unix nanoseconds); /ws a WebSocket echo; /echo Echo.
// Callers add their own routes.
func NewMux(sseEvery time.Duration) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"path": r.URL.Path, "query": r.URL.RawQuery, "host": r.Host, "header": r.Header, "from": "guest"})
	})
	mux.HandleFunc("/page", func(w http.ResponseWriter, r *http.Request) {
		h, _ := json.Marshal(r.Header)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><html><body style="margin:0;background:#1e90ff;height:100vh">`+
			`<h1 id="who">served by the guest</h1><pre id="req">%s</pre></body></html>`, html.EscapeString(string(h)))
	})
	big := sync.OnceValue(func() []byte { return make([]byte, 8<<20) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(big()) })
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for {
			if _, err := fmt.Fprintf(w, "data: %d\n\n", time.Now().UnixNano()); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(sseEvery):
			}
		}
	})
	mux.HandleFunc("/echo", Echo)
	mux.HandleFunc("/ws", func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, b, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, b); err != nil {
				return
			}
		}
	})
	return mux
}
