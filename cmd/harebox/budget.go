package main

// Budgets and usage: harebox budget create, list, get, delete; harebox
// usage.

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/budget/money"
)

var cmdBudget = group("budget", []subcommand{
	{"create", "--scope account|project:REF|fleet:ID|key:ID|label:K=V[,K=V] --limit USD --action notify|deny_new|pause|stop|delete [--period monthly|total] [--warn PERCENT] [--name NAME] [--account REF]",
		"set a dollar limit and what happens when it is reached", budgetCreate},
	{"list", "[--account REF]", "list the budgets with what they spent and reserved", budgetList},
	{"get", "BUDGET_ID", "show a budget", budgetCmd("GET")},
	{"delete", "BUDGET_ID", "remove a budget", budgetCmd("DELETE")},
})

const budgetHeader = "ID\tNAME\tSCOPE\tPERIOD\tLIMIT\tSPENT\tRESERVED\tACTION\tREACHED"

func budgetRow(b apiclient.Budget) []string {
	scope := b.Scope.Kind
	if b.Scope.Ref != "" {
		scope += ":" + b.Scope.Ref
	}
	if len(b.Scope.Labels) > 0 {
		var kv []string
		for k, v := range b.Scope.Labels {
			kv = append(kv, k+"="+v)
		}
		scope += ":" + strings.Join(kv, ",")
	}
	return []string{b.ID, dash(b.Name), scope, b.Period, b.Limit, b.Spent, b.Reserved, b.Action, when(b.ReachedAt)}
}

// parseScope reads account, project:REF, fleet:ID, key:ID or
// label:K=V[,K=V].
func parseScope(s string) (apiclient.BudgetScope, error) {
	kind, rest, _ := strings.Cut(s, ":")
	sc := apiclient.BudgetScope{Kind: kind}
	switch kind {
	case "account":
		if rest != "" {
			return sc, fmt.Errorf("--scope %q: account takes nothing after it", s)
		}
	case "project", "fleet", "key":
		if rest == "" {
			return sc, fmt.Errorf("--scope %q: want %s:REF", s, kind)
		}
		sc.Ref = rest
	case "label":
		sc.Labels = map[string]string{}
		for _, p := range strings.Split(rest, ",") {
			k, v, ok := strings.Cut(p, "=")
			if !ok || k == "" {
				return sc, fmt.Errorf("--scope %q: want label:KEY=VALUE[,KEY=VALUE]", s)
			}
			sc.Labels[k] = v
		}
	default:
		return sc, fmt.Errorf("--scope %q: want account, project:REF, fleet:ID, key:ID or label:K=V", s)
	}
	return sc, nil
}

func budgetCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	account := fs.String("account", "", "the budget's account, ID or name (the operator only; a key sets budgets in its own)")
	name := fs.String("name", "", "a name for the budget")
	scope := fs.String("scope", "", "what it covers: account, project:REF, fleet:ID, key:ID or label:KEY=VALUE[,KEY=VALUE]")
	limit := fs.String("limit", "", "the dollar limit, e.g. 25.00")
	period := fs.String("period", "monthly", "monthly (calendar months, UTC) or total")
	action := fs.String("action", "", "when reached: notify, deny_new, pause, stop or delete")
	var warn list
	fs.Var(&warn, "warn", "announce in the audit log when spend reaches PERCENT of the limit (comma-separated or repeated)")
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	if *scope == "" || *limit == "" || *action == "" {
		return 0, usageError{"--scope, --limit and --action are required"}
	}
	sc, err := parseScope(*scope)
	if err != nil {
		return 0, usageError{err.Error()}
	}
	l := strings.TrimPrefix(*limit, "$")
	if _, err := money.ParseUSD(l); err != nil {
		return 0, usageError{"--limit: " + err.Error()}
	}
	req := apiclient.BudgetRequest{Name: *name, Scope: sc, Period: *period, Limit: l, Action: *action}
	for _, w := range warn {
		n, err := strconv.Atoi(strings.TrimSuffix(w, "%"))
		if err != nil {
			return 0, usageError{fmt.Sprintf("--warn %q: want a percentage, 1 to 99", w)}
		}
		req.WarnAt = append(req.WarnAt, n)
	}
	var b apiclient.Budget
	if err := c.c.Do(ctx, "POST", apiclient.Path("budgets"), apiclient.AccountQuery(*account), req, &b); err != nil {
		return 0, err
	}
	return 0, c.show(b, budgetHeader, [][]string{budgetRow(b)})
}

func budgetList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	account := fs.String("account", "", "the account, ID or name (the operator only; default: the default account)")
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var out struct {
		Budgets []apiclient.Budget `json:"budgets"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("budgets"), apiclient.AccountQuery(*account), nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, b := range out.Budgets {
		rows = append(rows, budgetRow(b))
	}
	return 0, c.show(out, budgetHeader, rows)
}

func budgetCmd(method string) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
		pos, err := exactly(fs, c, args, "BUDGET_ID")
		if err != nil {
			return 0, err
		}
		if method == "DELETE" {
			if err := c.c.Do(ctx, method, apiclient.Path("budgets", pos[0]), nil, nil, nil); err != nil {
				return 0, err
			}
			return 0, c.deleted("budget", pos[0])
		}
		var b apiclient.Budget
		if err := c.c.Do(ctx, method, apiclient.Path("budgets", pos[0]), nil, nil, &b); err != nil {
			return 0, err
		}
		return 0, c.show(b, budgetHeader, [][]string{budgetRow(b)})
	}
}

func cmdUsage(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox usage", flag.ContinueOnError)
	account := fs.String("account", "", "the account, ID or name (the operator only; default: every account's)")
	from := fs.String("from", "", "only intervals that end after this RFC 3339 time")
	to := fs.String("to", "", "only intervals that start before this RFC 3339 time")
	groupBy := fs.String("group-by", "sandbox", "account, project, fleet, key, sandbox or label:KEY")
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	q := url.Values{"group_by": {*groupBy}}
	for name, v := range map[string]string{"from": *from, "to": *to} {
		if v == "" {
			continue
		}
		if _, err := time.Parse(time.RFC3339, v); err != nil {
			return 0, usageError{fmt.Sprintf("--%s %q: want an RFC 3339 time, e.g. 2026-11-30T12:00:00Z", name, v)}
		}
		q.Set(name, v)
	}
	if *account != "" {
		q.Set("account", *account)
	}
	var out struct {
		Usage []apiclient.UsageGroup `json:"usage"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("usage"), q, nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, g := range out.Usage {
		rows = append(rows, []string{dash(g.Group), dash(g.Name), fmt.Sprint(g.VCPUSeconds), fmt.Sprint(g.MemoryGiBSeconds), fmt.Sprint(g.PausedSeconds), fmt.Sprint(g.EgressBytes), fmt.Sprint(g.SnapshotGBSeconds), g.Cost})
	}
	return 0, c.show(out, "GROUP\tNAME\tVCPU_SECONDS\tMEMORY_GIB_SECONDS\tPAUSED_SECONDS\tEGRESS_BYTES\tSNAPSHOT_GB_SECONDS\tCOST_USD", rows)
}

func cmdEvents(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox events", flag.ContinueOnError)
	account := fs.String("account", "", "only this account's events, ID or name (the operator only; a key sees its own account's)")
	after := fs.Int64("after", 0, "only events after this cursor (a sequence number: the next of the last page)")
	limit := fs.Int("limit", 100, "at most this many events, 1 to 1000 (without --follow)")
	follow := fs.Bool("follow", false, "print events as they happen, one JSON object per line, until interrupted")
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	q := url.Values{"after": {strconv.FormatInt(*after, 10)}}
	if *account != "" {
		q.Set("account", *account)
	}
	if *follow {
		err := c.c.FollowEvents(ctx, q, func(ev json.RawMessage) error {
			_, err := fmt.Fprintf(c.stdout, "%s\n", ev)
			return err
		})
		return 0, err
	}
	q.Set("limit", strconv.Itoa(*limit))
	var out struct {
		Events []apiclient.AuditEntry `json:"events"`
		Next   string                 `json:"next"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("events"), q, nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, e := range out.Events {
		rows = append(rows, []string{strconv.FormatInt(e.Seq, 10), e.Time.Format(time.RFC3339), e.Principal, e.Action, dash(e.Target)})
	}
	return 0, c.show(out, "SEQ\tTIME\tBY\tEVENT\tTARGET", rows)
}
