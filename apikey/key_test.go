package apikey

import (
	"strings"
	"testing"

	"github.com/harebox/harebox/tenant"
)

// Either form of a secret names its key; nothing else parses as one.
func TestSecretForms(t *testing.T) {
	id := tenant.NewID(IDPrefix)
	for _, format := range []string{"", FormatHareBox, FormatE2B} {
		secret, hash, err := newSecret(id, format)
		if err != nil || len(hash) != 32 {
			t.Fatal(err)
		}
		if got, ok := keyIDOf(secret); !ok || got != id {
			t.Errorf("%q names %q %v, want %q", secret, got, ok, id)
		}
		want := format
		if want == "" {
			want = FormatHareBox
		}
		if got := formatOf(&Key{Hint: hint(secret)}); got != want {
			t.Errorf("format of %q: %q, want %q", secret, got, want)
		}
	}
	e2b, _, _ := newSecret(id, FormatE2B)
	for _, bad := range []string{
		"", "e2b_", "e2b_zz" + e2b[6:], e2b + "00", e2b[:len(e2b)-2], strings.ToUpper(e2b),
		"hbk_" + e2b[4:], Prefix + "x_" + strings.Repeat("0", 64),
	} {
		if id, ok := keyIDOf(bad); ok {
			t.Errorf("%q parsed as key %q", bad, id)
		}
	}
}
