package harebox_test

import (
	"context"
	"net/url"
	"testing"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/hypervisor/memhv"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/store"
)

// TestURLCallsAudited: the URL calls (ingress.Calls, wired by the engine)
// record each change on its sandbox, in the sandbox's account, and each
// URL CA change on its project (the reference when there is none), for
// what was done and what was refused.
func TestURLCallsAudited(t *testing.T) {
	ctx := context.Background()
	hv := memhv.New(memhv.Options{})
	t.Cleanup(func() { hv.Close() })
	opts := memhvOptions(t, hv)
	opts.Network = &portsNet{}
	opts.Ingress, _ = url.Parse("https://apps.test:8443")
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	box, err := eng.Create(ctx, sandbox.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	calls := eng.URLCalls()
	u, err := calls.Create(ctx, box.ID, sandbox.URLRequest{Port: 8080})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := calls.Rotate(ctx, box.ID, u.ID); err != nil {
		t.Fatal(err)
	}
	other := authz.WithPrincipal(ctx, authz.Principal{AccountID: "acc_other", Scope: authz.Scope{Actions: []string{"*"}}})
	if _, err := calls.Rotate(other, box.ID, u.ID); err == nil {
		t.Fatal("another account rotated a URL")
	}
	if err := calls.Delete(ctx, box.ID, u.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := calls.IssueCert(ctx, "", "nope", sandbox.ClientCertRequest{Name: "alice"}); err == nil {
		t.Fatal("issued from a project that does not exist")
	}
	if _, err := calls.List(ctx, box.ID); err != nil { // a read: not recorded
		t.Fatal(err)
	}

	type entry struct{ action, account, target, outcome string }
	want := []entry{
		{"createURL", box.AccountID, box.ID, "ok"},
		{"rotateURL", box.AccountID, box.ID, "ok"},
		// A refusal is filed in the caller's account (audit.Log.Record).
		{"rotateURL", "acc_other", box.ID, "denied"},
		{"deleteURL", box.AccountID, box.ID, "ok"},
		{"issueClientCert", "", "nope", "denied"}, // not found
	}
	l, err := eng.Audit().List(ctx, store.AuditFilter{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var got []entry
	for _, e := range l {
		switch e.Action {
		case "createURL", "rotateURL", "deleteURL", "listURLs", "issueClientCert":
			got = append(got, entry{e.Action, e.AccountID, e.Target, e.Outcome})
		}
	}
	if len(got) != len(want) {
		t.Fatalf("audit entries %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %+v, want %+v", i, got[i], want[i])
		}
	}
}
