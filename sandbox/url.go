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
	// URLAuthOIDC: an OpenID Connect ID token from an issuer, for a
	// subject, email or group the URL allows, as a bearer token.
	URLAuthOIDC = "oidc"
	// URLAuthMTLS: a TLS client certificate from the project's URL
	// certificate authority (URLCA), not revoked; host form only.
	URLAuthMTLS = "mtls"
)

// OIDCRule says whose OpenID Connect tokens a URL accepts: signed by the
// issuer (checked against its published keys), for the audience, not
// expired, and naming one of the subjects, one of the emails (verified,
// when the token says), or one of the groups (its "groups" claim).
type OIDCRule struct {
	Issuer   string   `json:"issuer" validate:"required,url,startswith=https://,max=512"`
	Audience string   `json:"audience" validate:"required,max=256"`
	Subjects []string `json:"subjects,omitempty" validate:"max=100,dive,required,max=256"`
	Emails   []string `json:"emails,omitempty" validate:"max=100,dive,required,max=256"`
	Groups   []string `json:"groups,omitempty" validate:"max=100,dive,required,max=256"`
}

// URL is a sandbox's TCP port published through the host's ingress
// behind an auth mode. The guest's port is reached only through it.
type URL struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	AccountID string `json:"account_id"`
	ProjectID string `json:"project_id"`
	Port      int    `json:"port"`
	Auth      string `json:"auth"`
	// OIDC is the rule of an oidc URL.
	OIDC *OIDCRule `json:"oidc,omitempty"`
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
	Auth string `json:"auth,omitempty" validate:"omitempty,oneof=token oidc mtls"`
	// OIDC is required with auth oidc, and refused otherwise.
	OIDC *OIDCRule `json:"oidc,omitempty"`
}

// URLIDPrefix starts every URL ID.
const URLIDPrefix = "url_"

// NewURLID returns a new URL ID: the prefix and a lower-case ULID.
func NewURLID() string {
	return URLIDPrefix + strings.ToLower(ulid.MustNew(ulid.Now(), rand.Reader).String())
}

// URLCA is the certificate authority that a project's mtls URLs check
// client certificates against: one the host made (and issues client
// certificates from) or one the user uploaded (and issues from itself).
type URLCA struct {
	ProjectID string `json:"project_id"`
	// Certificate is the CA's certificate, PEM.
	Certificate string    `json:"certificate"`
	Uploaded    bool      `json:"uploaded"`
	CreatedAt   time.Time `json:"created_at"`
}

// URLCARequest sets a project's URL certificate authority: Certificate
// (PEM, a CA certificate) to upload one, none for the host to make a new
// one. Either way the old one, and what it signed, stops working.
type URLCARequest struct {
	Certificate string `json:"certificate,omitempty" validate:"max=65536"`
}

// ClientCertRequest issues a client certificate from a project's CA.
type ClientCertRequest struct {
	// Name is the certificate's subject common name (who holds it).
	Name string `json:"name" validate:"required,max=64,printascii"`
	// TTL is how long it is valid, a Go duration ("720h"); default
	// 2160h (90 days), at most 8760h.
	TTL string `json:"ttl,omitempty" validate:"max=32"`
}

// ClientCert is a client certificate a project issued, or a serial it
// revoked.
type ClientCert struct {
	ProjectID string `json:"project_id"`
	// Serial is the certificate's serial number, lower-case hex.
	Serial string `json:"serial"`
	Name   string `json:"name,omitempty"`
	// Issued: by the host, from the project's CA (else only revoked).
	Issued bool `json:"issued"`
	// IssuerKeys are the SHA-256 hashes (hex) of the public keys of the
	// CAs the serial is theirs of: the one that issued it, or those the
	// project had when it was revoked. A revocation holds for those CAs,
	// whatever certificate carries their key (the same CA set again, or
	// renewed).
	IssuerKeys []string   `json:"issuer_keys,omitempty"`
	NotAfter   *time.Time `json:"not_after,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	RevokedAt  *time.Time `json:"revoked_at,omitempty"`
	// Certificate and PrivateKey (PEM) are returned by issue only: the
	// host does not keep the key.
	Certificate string `json:"certificate,omitempty"`
	PrivateKey  string `json:"private_key,omitempty"`
}
