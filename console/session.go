package console

import (
	"net/http"
	"strings"
)

// A signed-in browser holds a session (apikey.Sessions, kept in the
// store) that stands for the API key it signed in with.

// Cookie is the name of the cookie that carries a session's ID.
const Cookie = "harebox_console"

// CSRFHeader carries a session's CSRF token on every request made with
// the session; CSRFParam carries it on a WebSocket's handshake, to which
// a browser cannot add a header. The page keeps the token in its origin's
// storage, which a page on another port or host cannot read or write,
// whereas cookies are shared by every port of a host name.
const (
	CSRFHeader = "X-CSRF-Token"
	CSRFParam  = "csrf_token"
)

// DropCookie takes the session's cookie off a request that goes to a
// sandbox (a proxy on the same host name gets it, as any port does).
func DropCookie(h http.Header) {
	var keep []string
	for _, c := range (&http.Request{Header: h}).Cookies() {
		if c.Name != Cookie {
			keep = append(keep, c.String())
		}
	}
	h.Del("Cookie")
	if len(keep) > 0 {
		h.Set("Cookie", strings.Join(keep, "; "))
	}
}

// DropSetCookie takes a sandbox's Set-Cookie for the session's cookie off
// its answer.
func DropSetCookie(h http.Header) {
	sc := h.Values("Set-Cookie")
	h.Del("Set-Cookie")
	for _, v := range sc {
		if c, err := http.ParseSetCookie(v); err == nil && !strings.EqualFold(c.Name, Cookie) {
			h.Add("Set-Cookie", v)
		}
	}
}
