package harebox_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"testing"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/sandbox"
)

// portsNet is a network with no links that can take an ingress (the
// real one is tested in network/linuxnet and e2e).
type portsNet struct{ network.None }

func (n *portsNet) DialGuest(context.Context, string, uint16) (net.Conn, error) {
	return nil, errors.New("no guests here")
}

func (n *portsNet) ClosePorts(context.Context, string, ...uint16) error { return nil }

// TestURLs: publishing needs an ingress, is authorized on the sandbox,
// and a sandbox's URLs go with it.
func TestURLs(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })

	// Without an ingress: a clear refusal.
	opts := memhvOptions(t, hv)
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	box, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.URLCalls().Create(ctx, box.ID, sandbox.URLRequest{Port: 80}); !errors.Is(err, sandbox.ErrUnavailable) {
		t.Errorf("no ingress: %v", err)
	}
	eng.Delete(ctx, box.ID)
	eng.Close()

	n := &portsNet{}
	opts = memhvOptions(t, hv)
	opts.Network = n
	opts.Ingress, _ = url.Parse("https://apps.test:8443")
	eng, err = harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	box, err = eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	u, err := eng.URLCalls().Create(ctx, box.ID, sandbox.URLRequest{Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if u.PathURL != "https://apps.test:8443/s/"+box.ID+"/8080/" || u.Token == "" || u.AccountID != box.AccountID {
		t.Errorf("created %+v", u)
	}
	for _, bad := range []sandbox.URLRequest{{Port: 0}, {Port: 65536}, {Port: 80, Auth: "magic"}} {
		if _, err := eng.URLCalls().Create(ctx, box.ID, bad); !errors.Is(err, sandbox.ErrInvalid) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	if _, err := eng.URLCalls().Create(ctx, box.ID, sandbox.URLRequest{Port: 8080}); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("the same port again: %v", err)
	}
	if got, err := eng.URLCalls().Get(ctx, box.ID, u.ID); err != nil || got.Token != "" {
		t.Errorf("get shows %+v, %v", got, err)
	}
	// A key of another account sees nothing.
	other := authz.WithPrincipal(ctx, authz.Principal{AccountID: "acc_other", Scope: authz.Scope{Actions: []string{"*"}}})
	if _, err := eng.URLCalls().List(other, box.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another account lists: %v", err)
	}
	if _, err := eng.URLCalls().Rotate(other, box.ID, u.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("another account rotates: %v", err)
	}

	// Deleting the sandbox unpublishes its URLs.
	if err := eng.Delete(ctx, box.ID); err != nil {
		t.Fatal(err)
	}
	if l, err := eng.URLs().List(ctx, box.ID); err != nil || len(l) != 0 {
		t.Errorf("after delete: %v %v", l, err)
	}
	if _, err := eng.URLCalls().Create(ctx, box.ID, sandbox.URLRequest{Port: 9090}); !errors.Is(err, sandbox.ErrState) {
		t.Errorf("publishing on a deleted sandbox: %v", err)
	}
}
