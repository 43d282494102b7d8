package e2b

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/secrets/sandboxkeys"
)

// The tokens' names in a sandbox's scope of the secret store (and the
// labels they are sealed under): its envd access token, and its traffic
// token (a sandbox whose ports are not public).
const (
	envdTokenName    = "e2b-envd-access-token"
	trafficTokenName = "e2b-traffic-access-token"
)

// A stored token starts with one byte that says how it is sealed: under
// the sandbox's data key, or by the master key alone (a sandbox without a
// data key: an engine with plaintext disks).
const (
	sealedUnderDataKey = 'k'
	sealedPlain        = 'p'
)

// tokens keeps a token of each sandbox, by name. The token itself is
// kept, not a hash: connect and info return it again, as E2B's do. It is
// sealed under the sandbox's data key, which the engine erases first when
// the sandbox is deleted, so what is left of it then is ciphertext without
// a key.
type tokens struct {
	sec  secrets.Store
	name string
	// mu serialises a token's first issue (a connect to a sandbox made
	// through the HareBox API), so two connects get the same one.
	mu sync.Mutex
}

// issue makes and keeps a new random token for sandbox id.
func (t *tokens) issue(ctx context.Context, id string) (string, error) {
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	tok := hex.EncodeToString(raw)
	key, err := sandboxkeys.DataKey(ctx, t.sec, id)
	if err != nil {
		return "", fmt.Errorf("e2b: the sandbox's data key: %w", err)
	}
	mark := byte(sealedUnderDataKey)
	if key == nil {
		mark = sealedPlain
	}
	sealed, err := sandboxkeys.Seal(key, t.name, []byte(tok))
	if err != nil {
		return "", fmt.Errorf("e2b: seal the %s: %w", t.name, err)
	}
	if err := t.sec.Put(ctx, sandboxkeys.Scope(id), t.name, append([]byte{mark}, sealed...)); err != nil {
		return "", fmt.Errorf("e2b: keep the %s: %w", t.name, err)
	}
	return tok, nil
}

// errNoToken: the sandbox has no token (yet), or its key is gone.
var errNoToken = errors.New("e2b: no envd access token")

// get returns sandbox id's token.
func (t *tokens) get(ctx context.Context, id string) (string, error) {
	v, err := t.sec.Get(ctx, sandboxkeys.Scope(id), t.name)
	if errors.Is(err, secrets.ErrNotFound) {
		return "", errNoToken
	}
	if err != nil {
		return "", err
	}
	if len(v) < 1 {
		return "", errNoToken
	}
	key, err := sandboxkeys.DataKey(ctx, t.sec, id)
	if err != nil {
		return "", err
	}
	switch {
	case v[0] == sealedUnderDataKey && key != nil, v[0] == sealedPlain && key == nil:
	default:
		// Sealed under a key that is gone (the sandbox was deleted).
		return "", errNoToken
	}
	tok, err := sandboxkeys.Open(key, t.name, v[1:])
	if err != nil {
		return "", fmt.Errorf("e2b: open the %s: %w", t.name, err)
	}
	return string(tok), nil
}

// ensure returns sandbox id's token, issuing one if it has none (it was
// created through HareBox's own API). Only for a live sandbox: a deleted
// one's data key is gone, and a token issued then would be sealed by the
// master key alone.
func (t *tokens) ensure(ctx context.Context, id string) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, err := t.get(ctx, id)
	if errors.Is(err, errNoToken) {
		return t.issue(ctx, id)
	}
	return tok, err
}

// forget removes sandbox id's token (its key is already erased).
func (t *tokens) forget(ctx context.Context, id string) error {
	if err := t.sec.Delete(ctx, sandboxkeys.Scope(id), t.name); err != nil && !errors.Is(err, secrets.ErrNotFound) {
		return err
	}
	return nil
}

// VerifyAccessToken checks, in constant time, that token is sandbox id's
// envd access token (id in either form): nil, or an error of kind
// unauthenticated. It needs no principal: the token is the envd
// request's credential.
func (h *Handler) VerifyAccessToken(ctx context.Context, id, token string) error {
	want, err := h.tokens.get(ctx, InternalID(id))
	if err != nil || token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(want)) != 1 {
		return sandbox.Errorf(sandbox.ErrUnauthenticated, "", "invalid envd access token for sandbox %s", ExternalID(id))
	}
	return nil
}
