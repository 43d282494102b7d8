// Command guestweb is a web app for tests to run in a guest: the routes of
// internal/testweb.
package main

import (
	"flag"
	"log"
	"net/http"
	"time"

	"github.com/harebox/harebox/internal/testweb"
)

func main() {
	addr := flag.String("listen", ":8080", "address")
	flag.Parse()
	log.Fatal(http.ListenAndServe(*addr, testweb.NewMux(50*time.Millisecond)))
}
