// Package apikey issues, authenticates, attenuates, rotates and revokes
// scoped API keys. A key's secret is shown once, when it is made; only its
// SHA-256 is stored (the secret is 256 random bits, so a fast hash is
// enough). Every secret starts with "hbk_" so secret scanners find it.
// Authenticate turns a secret into an authz.Principal, checking expiry,
// revocation, the caller's address and the key's request rate.
package apikey

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/harebox/harebox/store"
	"github.com/harebox/harebox/tenant"
)

// Prefix starts every HareBox API key secret.
const Prefix = "hbk_"

// IDPrefix starts every key ID.
const IDPrefix = "key_"

// Key is a stored API key; the record lives in the store.
type Key = store.Key

// newSecret returns a new secret for key id: "hbk_" + the ID's ULID + "_"
// + 64 hex characters, and its hash.
func newSecret(id string) (secret string, hash []byte, err error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", nil, err
	}
	secret = Prefix + strings.TrimPrefix(id, IDPrefix) + "_" + hex.EncodeToString(raw)
	sum := sha256.Sum256([]byte(secret))
	return secret, sum[:], nil
}

// keyIDOf returns the key ID a secret names, or false if it is not a
// scoped key's secret.
func keyIDOf(secret string) (string, bool) {
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
func hint(secret string) string { return Prefix + "..." + secret[len(secret)-4:] }
