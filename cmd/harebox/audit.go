package main

// The audit log: harebox audit list, export, verify and key. A key sees its
// own account's entries; verify is the operator's.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strconv"
	"time"

	"github.com/harebox/harebox/apiclient"
)

const auditFilters = "[--from TIME] [--to TIME] [--principal P] [--target T] [--action A] [--outcome ok|denied|error] [--account ID]"

var cmdAudit = group("audit", []subcommand{
	{"list", auditFilters + " [--limit N] [--after CURSOR] [--newest] [--follow]",
		"a page of audit entries, oldest first (JSON with the next page's cursor, or a table); --newest the last N instead of the first; --follow then prints each new entry as it is appended, one JSON object per line, until interrupted", auditList},
	{"export", auditFilters + " [--after CURSOR]",
		"every matching entry as JSON Lines on stdout, streamed (for a SIEM)", auditExport},
	{"verify", "", "check the hash chain, every entry's columns, and the signed checkpoints in the database and in the anchor (the operator only); exit 1 if the log was tampered with or its tail cut", auditVerify},
	{"key", "", "the ed25519 public key that verifies the signed checkpoints", auditKey},
})

// auditFlags defines the filters on fs; check validates them once parsed.
func auditFlags(fs *flag.FlagSet) (f *apiclient.AuditFilter, check func() error) {
	f = &apiclient.AuditFilter{}
	fs.StringVar(&f.From, "from", "", "only entries at or after this RFC 3339 time, e.g. 2026-11-30T12:00:00Z")
	fs.StringVar(&f.To, "to", "", "only entries before this RFC 3339 time")
	fs.StringVar(&f.Principal, "principal", "", `only this principal's entries: a key ID, or "operator"`)
	fs.StringVar(&f.Target, "target", "", "only entries on this target (a sandbox, key, project ... as the entries name it)")
	fs.StringVar(&f.Action, "action", "", "only this action (an operationId, e.g. exec or createKey)")
	fs.StringVar(&f.Outcome, "outcome", "", "only this outcome: ok, denied or error")
	fs.StringVar(&f.Account, "account", "", "only this account's entries, an account ID (the operator only; a key sees its own account's)")
	fs.StringVar(&f.After, "after", "", "only entries after this cursor (a sequence number: the next of the last page)")
	return f, func() error {
		for name, v := range map[string]string{"--from": f.From, "--to": f.To} {
			if _, err := time.Parse(time.RFC3339, v); v != "" && err != nil {
				return usageError{fmt.Sprintf("%s %q: want an RFC 3339 time, e.g. 2026-11-30T12:00:00Z", name, v)}
			}
		}
		switch f.Outcome {
		case "", "ok", "denied", "error":
		default:
			return usageError{fmt.Sprintf("--outcome %q: want ok, denied or error", f.Outcome)}
		}
		if n, err := strconv.ParseInt(f.After, 10, 64); f.After != "" && (err != nil || n < 0) {
			return usageError{fmt.Sprintf("--after %q: want a sequence number (the next of the last page)", f.After)}
		}
		return nil
	}
}

func auditList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	f, check := auditFlags(fs)
	fs.IntVar(&f.Limit, "limit", 100, "at most this many entries, 1 to 1000")
	fs.BoolVar(&f.Newest, "newest", false, "the last --limit entries that match rather than the first (still oldest first)")
	follow := fs.Bool("follow", false, "print the entries, then each new one as it is appended, one JSON object per line, until interrupted")
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	if err := check(); err != nil {
		return 0, err
	}
	if f.Limit < 1 || f.Limit > 1000 {
		return 0, usageError{fmt.Sprintf("--limit %d: want 1 to 1000", f.Limit)}
	}
	if *follow {
		return 0, c.c.FollowAudit(ctx, *f, func(e apiclient.AuditEntry) error {
			b, err := json.Marshal(e)
			if err == nil {
				_, err = fmt.Fprintf(c.stdout, "%s\n", b)
			}
			return err
		})
	}
	var out apiclient.AuditList
	if err := c.c.Do(ctx, "GET", apiclient.Path("audit"), f.Query(), nil, &out); err != nil {
		return 0, err
	}
	if out.Entries == nil {
		out.Entries = []apiclient.AuditEntry{}
	}
	if c.output == "json" {
		return 0, c.json(out)
	}
	var rows [][]string
	for _, e := range out.Entries {
		outcome := e.Outcome
		if e.Error != "" {
			outcome += " (" + e.Error + ")"
		}
		rows = append(rows, []string{strconv.FormatInt(e.Seq, 10), when(&e.Time), e.Principal, e.Action, dash(e.Target), outcome})
	}
	if err := c.table("SEQ\tTIME\tPRINCIPAL\tACTION\tTARGET\tOUTCOME", rows); err != nil {
		return 0, err
	}
	if out.Next != "" {
		_, err := fmt.Fprintf(c.stdout, "\nmore: --after %s\n", out.Next)
		return 0, err
	}
	return 0, nil
}

func auditExport(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	f, check := auditFlags(fs)
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	if err := check(); err != nil {
		return 0, err
	}
	return 0, c.c.ExportAudit(ctx, *f, c.stdout)
}

func auditVerify(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var r apiclient.AuditReport
	if err := c.c.Do(ctx, "GET", apiclient.Path("audit", "verify"), nil, nil, &r); err != nil {
		return 0, err
	}
	first := "-"
	if r.FirstBad != 0 {
		first = strconv.FormatInt(r.FirstBad, 10)
	}
	if err := c.show(r, "OK\tENTRIES\tCHECKPOINTS\tFIRST-BAD\tANCHORED\tUNANCHORED\tANCHOR\tREASON",
		[][]string{{yesNo(r.OK), strconv.FormatInt(r.Entries, 10), strconv.Itoa(r.Checkpoints), first,
			strconv.FormatInt(r.Anchored, 10), strconv.FormatInt(r.Unanchored, 10), dash(r.Anchor), dash(r.Reason)}}); err != nil {
		return 0, err
	}
	if !r.OK {
		return 0, fmt.Errorf("the audit log does not verify: first bad entry %s: %s", first, dash(r.Reason))
	}
	return 0, nil
}

func auditKey(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var k apiclient.AuditKey
	if err := c.c.Do(ctx, "GET", apiclient.Path("audit", "key"), nil, nil, &k); err != nil {
		return 0, err
	}
	return 0, c.show(k, "ALGORITHM\tPUBLIC-KEY", [][]string{{k.Algorithm, k.PublicKey}})
}
