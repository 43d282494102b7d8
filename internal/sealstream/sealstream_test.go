package sealstream

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"
)

func key(t *testing.T) []byte {
	k := make([]byte, KeySize)
	rand.Read(k)
	return k
}

func seal(t *testing.T, k, plain []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, k)
	if err != nil {
		t.Fatal(err)
	}
	// Odd write sizes cross record boundaries.
	for p := plain; len(p) > 0; {
		n := min(len(p), 100_003)
		if _, err := w.Write(p[:n]); err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func open(k, sealed []byte) ([]byte, error) {
	r, err := NewReader(bytes.NewReader(sealed), k)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

func TestRoundTrip(t *testing.T) {
	k := key(t)
	for _, n := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, 3*ChunkSize + 77} {
		plain := make([]byte, n)
		rand.Read(plain)
		sealed := seal(t, k, plain)
		if n > 64 && bytes.Contains(sealed, plain[:64]) {
			t.Fatalf("n=%d: plaintext visible in the sealed stream", n)
		}
		got, err := open(k, sealed)
		if err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		if !bytes.Equal(got, plain) {
			t.Fatalf("n=%d: round trip differs", n)
		}
	}
}

func TestRefusesWrongKeyAndDamage(t *testing.T) {
	k := key(t)
	plain := bytes.Repeat([]byte("canary!"), ChunkSize/3)
	sealed := seal(t, k, plain)
	if _, err := open(key(t), sealed); !errors.Is(err, ErrAuth) {
		t.Fatalf("wrong key: %v, want ErrAuth", err)
	}
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)/2] ^= 1
	if _, err := open(k, flipped); !errors.Is(err, ErrAuth) {
		t.Fatalf("flipped bit: %v, want ErrAuth", err)
	}
	// Cut after the first (full, middle) record: every remaining record
	// authenticates, but the stream has no last record.
	first := len(magic) + saltSize + 4 + ChunkSize + 16
	if _, err := open(k, sealed[:first]); !errors.Is(err, ErrAuth) {
		t.Fatalf("truncated at a record boundary: %v, want ErrAuth", err)
	}
	if _, err := open(k, sealed[:len(sealed)-1]); !errors.Is(err, ErrAuth) {
		t.Fatalf("truncated inside a record: %v, want ErrAuth", err)
	}
	if _, err := open(k[:16], sealed); err == nil {
		t.Fatal("short key accepted")
	}
	if _, err := open(k, []byte("not a sealed stream at all, no")); err == nil {
		t.Fatal("garbage accepted")
	}
}

func FuzzReader(f *testing.F) {
	k := make([]byte, KeySize)
	var buf bytes.Buffer
	w, _ := NewWriter(&buf, k)
	w.Write([]byte("hello"))
	w.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := NewReader(bytes.NewReader(b), k)
		if err != nil {
			return
		}
		io.Copy(io.Discard, r)
	})
}
