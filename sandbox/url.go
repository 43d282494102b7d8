package sandbox

import (
	"crypto/rand"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
)

// URL auth modes.
const (
	// URLAuthToken: a random bearer token, in a header or exchanged once
	// from a link's query parameter for a cookie.
	URLAuthToken = "token"
)

// URL is a sandbox's TCP port published through the host's ingress
// behind an auth mode. The guest's port is reached only through it.
type URL struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	AccountID string `json:"account_id"`
	Port      int    `json:"port"`
	Auth      string `json:"auth"`
	// URL is the host form (https://PORT-ID.DOMAIN/), HostURL's path
	// form (https://INGRESS/s/SANDBOX/PORT/) for hosts without wildcard
	// DNS. Both serve the same port.
	URL     string `json:"url"`
	PathURL string `json:"path_url"`
	// Token is the bearer token, returned only by create and rotate;
	// the host keeps its hash.
	Token string `json:"token,omitempty"`
	// Link is URL with the token as a query parameter, to share: the
	// first visit swaps it for a cookie. Only with Token.
	Link      string     `json:"link,omitempty"`
	CreatedAt time.Time  `json:"created_at"`
	RotatedAt *time.Time `json:"rotated_at,omitempty"`
}

// URLRequest publishes a port.
type URLRequest struct {
	Port int    `json:"port" validate:"required,min=1,max=65535"`
	Auth string `json:"auth,omitempty" validate:"omitempty,oneof=token"`
}

// URLIDPrefix starts every URL ID.
const URLIDPrefix = "url_"

// NewURLID returns a new URL ID: the prefix and a lower-case ULID.
func NewURLID() string {
	return URLIDPrefix + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String())
}
