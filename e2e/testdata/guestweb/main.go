// Command guestweb is a web app for tests to run in a guest: / answers
// with the request it got (path, Host, headers) as JSON, /big with 8 MiB,
// /sse streams events, /ws echoes WebSocket messages, /page is an HTML
// page for a browser: a blue page naming the request's headers.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"log"
	"net/http"
	"time"

	"github.com/coder/websocket"
)

func main() {
	addr := flag.String("listen", ":8080", "address")
	flag.Parse()
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
	big := make([]byte, 8<<20)
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(big) })
	mux.HandleFunc("/sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
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
	log.Fatal(http.ListenAndServe(*addr, mux))
}
