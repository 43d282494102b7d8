// Package apikey issues, authenticates, attenuates, rotates and revokes
// scoped API keys. A key's secret is shown once, when it is made; only its
// SHA-256 is stored (the secret is 256 random bits, so a fast hash is
// enough). Every secret starts with "hbk_" so secret scanners find it, or,
// for a key made in E2B's form (some versions of E2B's SDKs check it), with
// "e2b_" and hex digits only.
// Authenticate turns a secret into an authz.Principal, checking expiry,
// revocation, the caller's address and the key's request rate.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/oklog/ulid/v2"

	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Prefix starts every HareBox API key secret.
const Prefix = "hbk_"

// IDPrefix starts every key ID.
const IDPrefix = "key_"

// The forms of a key's secret (CreateRequest.Format): HareBox's, "hbk_",
// the key ID's ULID, "_" and 64 hex digits; or E2B's, "e2b_" and 96 hex
// digits (the ULID's 16 bytes, then the same 256 random bits). Either
// names its key, so a secret is looked up, never searched for.
const (
	FormatHareBox = "harebox"
	FormatE2B     = "e2b"
	E2BPrefix     = "e2b_"
)

// Key is a stored API key; the record lives in the store.
type Key = store.Key

// newSecret returns a new secret for key id in format, and its hash.
func newSecret(id, format string) (secret string, hash []byte, err error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", nil, err
	}
	secret = Prefix + strings.TrimPrefix(id, IDPrefix) + "_" + hex.EncodeToString(raw)
	if format == FormatE2B {
		u, err := ulid.ParseStrict(strings.ToUpper(strings.TrimPrefix(id, IDPrefix)))
		if err != nil {
			return "", nil, err
		}
		secret = E2BPrefix + hex.EncodeToString(u[:]) + hex.EncodeToString(raw)
	}
	sum := sha256.Sum256([]byte(secret))
	return secret, sum[:], nil
}

// formatOf is the form a key's secrets take (its hint shows it).
func formatOf(k *Key) string {
	if strings.HasPrefix(k.Hint, E2BPrefix) {
		return FormatE2B
	}
	return FormatHareBox
}

// keyIDOf returns the key ID a secret names, or false if it is not a
// scoped key's secret.
func keyIDOf(secret string) (string, bool) {
	if rest, ok := strings.CutPrefix(secret, E2BPrefix); ok {
		b, err := hex.DecodeString(rest)
		if err != nil || len(b) != 16+32 || strings.ToLower(rest) != rest {
			return "", false
		}
		id := IDPrefix + strings.ToLower(ulid.ULID(b[:16]).String())
		return id, tenant.ValidID(IDPrefix, id)
	}
	rest, ok := strings.CutPrefix(secret, Prefix)
	if !ok {
		return "", false
	}
	id, tail, ok := strings.Cut(rest, "_")
	if !ok || len(tail) != 64 {
		return "", false
	}
	id = IDPrefix + id
	return id, tenant.ValidID(IDPrefix, id)
}

// hint shows the secret's prefix and last four characters, which differ
// between keys and change with every rotation.
func hint(secret string) string {
	prefix := Prefix
	if strings.HasPrefix(secret, E2BPrefix) {
		prefix = E2BPrefix
	}
	return prefix + "..." + secret[len(secret)-4:]
}
