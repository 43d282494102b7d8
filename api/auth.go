package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/sandbox"
)

// KeyPrefix starts every HareBox API key.
const KeyPrefix = "hbk_"

// RootKey authenticates the root API key. Only its hash is kept in memory.
type RootKey struct {
	sum [32]byte
}

// Authenticate implements Authenticator in constant time: the root key is
// the operator.
func (k *RootKey) Authenticate(_ context.Context, token string) (authz.Principal, error) {
	sum := sha256.Sum256([]byte(token))
	if strings.HasPrefix(token, KeyPrefix) && subtle.ConstantTimeCompare(sum[:], k.sum[:]) == 1 {
		return authz.Operator, nil
	}
	return authz.Principal{}, sandbox.Errorf(sandbox.ErrUnauthenticated, "", "invalid API key")
}

// LoadOrCreateRootKey reads dataDir/root.key, creating it (mode 0600) with
// a new random key on first start. created says whether it was made now.
func LoadOrCreateRootKey(dataDir string) (k *RootKey, path string, created bool, err error) {
	path = filepath.Join(dataDir, "root.key")
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		raw := make([]byte, 32)
		if _, err := rand.Read(raw); err != nil {
			return nil, "", false, err
		}
		key := KeyPrefix + hex.EncodeToString(raw)
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, "", false, fmt.Errorf("api: create root key: %w", err)
		}
		_, err = f.WriteString(key + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(path)
			return nil, "", false, fmt.Errorf("api: write root key: %w", err)
		}
		b, created = []byte(key), true
	} else if err != nil {
		return nil, "", false, fmt.Errorf("api: read root key: %w", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, "", false, err
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, "", false, fmt.Errorf("api: %s is readable by others (mode %v); chmod 600 it", path, fi.Mode().Perm())
	}
	key := strings.TrimSpace(string(b))
	if !strings.HasPrefix(key, KeyPrefix) || len(key) < len(KeyPrefix)+32 {
		return nil, "", false, fmt.Errorf("api: %s does not hold a HareBox key", path)
	}
	return &RootKey{sum: sha256.Sum256([]byte(key))}, path, created, nil
}
