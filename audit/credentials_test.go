package audit_test

import (
	"context"
	"testing"

	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/store"
)

// An answer the credentials proxy refused is on the sandbox's account,
// as the sandbox's act, denied.
func TestRecordRefusedAnswer(t *testing.T) {
	l, db := open(t)
	l.RecordRefusedAnswer("acc_a", "sbx_x", "api.example.test")
	es, err := db.ListAudit(context.Background(), store.AuditFilter{Outcome: audit.Denied, AccountID: "acc_a"})
	if err != nil || len(es) != 1 {
		t.Fatal(es, err)
	}
	if e := es[0]; e.Action != "refuseAnswer" || e.Principal != "sandbox:sbx_x" || e.Target != "api.example.test" || e.Error != "unscrubbable" {
		t.Errorf("entry %+v", e)
	}
}
