package main

// The tenancy and key commands: harebox account, project, fleet and key.
// The operator (the root key) names an account other than the default one
// with --account; a scoped key always acts in its own.

import (
	"context"
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/budget/money"
)

// subcommand is one verb of a command group (harebox key create).
type subcommand struct {
	name, args, help string
	run              func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error)
}

// subError is an error of a subcommand; run names the subcommand, and its
// usage for a usageError, in its one line.
type subError struct {
	sub, args string
	err       error
}

func (e subError) Error() string { return e.err.Error() }
func (e subError) Unwrap() error { return e.err }

// group runs one of subs; `harebox GROUP --help` lists them.
func group(name string, subs []subcommand) func(ctx context.Context, c *cli, args []string) (int, error) {
	return func(ctx context.Context, c *cli, args []string) (int, error) {
		var names []string
		for _, s := range subs {
			names = append(names, s.name)
		}
		if len(args) == 0 {
			return 0, usageError{"want a subcommand: " + strings.Join(names, ", ")}
		}
		if a := args[0]; a == "-h" || a == "-help" || a == "--help" || a == "help" {
			fmt.Fprintf(c.stderr, "usage: harebox %s SUBCOMMAND ...\n\nsubcommands:\n", name)
			for _, s := range subs {
				fmt.Fprintf(c.stderr, "  %s %s\n      %s\n", s.name, s.args, s.help)
			}
			fmt.Fprintf(c.stderr, "\n'harebox %s SUBCOMMAND --help' describes a subcommand.\n", name)
			return 0, flag.ErrHelp
		}
		for _, s := range subs {
			if s.name != args[0] {
				continue
			}
			fs := flag.NewFlagSet(strings.TrimSpace("harebox "+name+" "+s.name+" "+s.args), flag.ContinueOnError)
			code, err := s.run(ctx, c, fs, args[1:])
			if inner, ok := err.(subError); ok { // a nested group's (harebox url ca get)
				err = subError{s.name + " " + inner.sub, inner.args, inner.err}
			} else if err != nil {
				err = subError{s.name, s.args, err}
			}
			return code, err
		}
		return 0, usageError{fmt.Sprintf("unknown %s subcommand %q (want %s)", name, args[0], strings.Join(names, ", "))}
	}
}

// nested makes a group a subcommand of another: harebox url ca get runs
// group("url ca", ...)'s get.
func nested(g func(ctx context.Context, c *cli, args []string) (int, error)) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, _ *flag.FlagSet, args []string) (int, error) {
		return g(ctx, c, args)
	}
}

// exactly parses flags and wants exactly the named positional arguments.
func exactly(fs *flag.FlagSet, c *cli, args []string, names ...string) ([]string, error) {
	pos, err := parse(fs, c, args, len(names))
	if err != nil {
		return nil, err
	}
	if len(pos) != len(names) {
		if len(names) == 0 {
			return nil, usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
		}
		return nil, usageError{"want exactly " + strings.Join(names, " ")}
	}
	return pos, nil
}

// list collects comma-separated, repeatable values (--actions a,b).
type list []string

func (l *list) String() string { return strings.Join(*l, ",") }
func (l *list) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// deleted reports a deletion that the API answers with no body.
func (c *cli) deleted(kind, ref string) error {
	if c.output == "table" {
		_, err := fmt.Fprintf(c.stdout, "deleted %s %s\n", kind, ref)
		return err
	}
	return c.json(map[string]string{"deleted": ref})
}

// table prints rows under a tab-separated header.
func (c *cli) table(header string, rows [][]string) error {
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

// show prints v as JSON, or rows as a table.
func (c *cli) show(v any, header string, rows [][]string) error {
	if c.output == "json" {
		return c.json(v)
	}
	return c.table(header, rows)
}

func when(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Format(time.RFC3339)
}

const namedHeader = "ID\tNAME\tCREATED"

func namedRow(id, name string, created time.Time) []string {
	return []string{id, name, when(&created)}
}

// Accounts.

var cmdAccount = group("account", []subcommand{
	{"create", "NAME", "create an account with its default project (the operator only)", accountCreate},
	{"list", "", "list the accounts (all for the operator, its own for a key)", accountList},
	{"get", "REF", "show an account (ID or name)", accountGet},
	{"update", "REF [--history-days N] [--output-days N] | REF --keep-forever",
		"set an account's command-history retention, in days (0 keeps nothing; the days not given are kept forever); lowering it purges at once", accountUpdate},
	{"delete", "REF", "delete an account without live sandboxes; its projects and fleets go, its keys are revoked (the operator only)", accountDelete},
})

func (c *cli) printAccounts(v any, as ...apiclient.Account) error {
	var rows [][]string
	for _, a := range as {
		rows = append(rows, append(namedRow(a.ID, a.Name, a.CreatedAt), days(a.Retention.HistoryDays), days(a.Retention.OutputDays)))
	}
	return c.show(v, namedHeader+"\tHISTORY-DAYS\tOUTPUT-DAYS", rows)
}

// days shows a retention's days: "forever" when absent.
func days(d *int) string {
	if d == nil {
		return "forever"
	}
	return strconv.Itoa(*d)
}

// optDays is a number of days that may be absent: 0 or more.
type optDays struct{ v *int }

func (o *optDays) String() string {
	if o == nil || o.v == nil {
		return ""
	}
	return strconv.Itoa(*o.v)
}
func (o *optDays) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want a whole number of days, 0 or more")
	}
	o.v = &n
	return nil
}

func accountCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	var a apiclient.Account
	if err := c.c.Do(ctx, "POST", apiclient.Path("accounts"), nil, apiclient.NameRequest{Name: pos[0]}, &a); err != nil {
		return 0, err
	}
	return 0, c.printAccounts(a, a)
}

func accountList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var out struct {
		Accounts []apiclient.Account `json:"accounts"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("accounts"), nil, nil, &out); err != nil {
		return 0, err
	}
	return 0, c.printAccounts(out, out.Accounts...)
}

func accountGet(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "REF")
	if err != nil {
		return 0, err
	}
	var a apiclient.Account
	if err := c.c.Do(ctx, "GET", apiclient.Path("accounts", pos[0]), nil, nil, &a); err != nil {
		return 0, err
	}
	return 0, c.printAccounts(a, a)
}

func accountUpdate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	var history, output optDays
	fs.Var(&history, "history-days", "keep command history entries `N` days (0: keep none; default: forever)")
	fs.Var(&output, "output-days", "keep their output `N` days (0: keep none; default: forever)")
	forever := fs.Bool("keep-forever", false, "clear the retention: keep history and output forever")
	pos, err := exactly(fs, c, args, "REF")
	if err != nil {
		return 0, err
	}
	ret := &apiclient.Retention{HistoryDays: history.v, OutputDays: output.v}
	switch {
	case *forever && (history.v != nil || output.v != nil):
		return 0, usageError{"--keep-forever clears the retention: give it without --history-days and --output-days"}
	case !*forever && history.v == nil && output.v == nil:
		return 0, usageError{"nothing to change (give --history-days, --output-days or --keep-forever)"}
	}
	var a apiclient.Account
	if err := c.c.Do(ctx, "PATCH", apiclient.Path("accounts", pos[0]), nil, apiclient.AccountUpdate{Retention: ret}, &a); err != nil {
		return 0, err
	}
	return 0, c.printAccounts(a, a)
}

func accountDelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	pos, err := exactly(fs, c, args, "REF")
	if err != nil {
		return 0, err
	}
	if err := c.c.Do(ctx, "DELETE", apiclient.Path("accounts", pos[0]), nil, nil, nil); err != nil {
		return 0, err
	}
	return 0, c.deleted("account", pos[0])
}

// Projects.

const accountHelp = "the account, ID or name (the operator only; default: the default account, or the key's own)"

var cmdProject = group("project", []subcommand{
	{"create", "NAME [--account REF]", "create a project", projectCmd("create")},
	{"list", "[--account REF]", "list an account's projects", projectCmd("list")},
	{"get", "REF [--account REF]", "show a project (ID or name)", projectCmd("get")},
	{"update", "REF [--third-party-default=true|false] [--mesh=true|false] [--account REF]", "change a project's settings", projectCmd("update")},
	{"delete", "REF [--account REF]", "delete a project without live sandboxes, and its fleets (not the default project)", projectCmd("delete")},
})

func (c *cli) printProjects(v any, ps ...apiclient.Project) error {
	var rows [][]string
	for _, p := range ps {
		rows = append(rows, append(namedRow(p.ID, p.Name, p.CreatedAt), yesNo(p.ThirdPartyDefault), yesNo(p.Mesh)))
	}
	return c.show(v, namedHeader+"\tTHIRD-PARTY-DEFAULT\tMESH", rows)
}

func projectCmd(verb string) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
		account := fs.String("account", "", accountHelp)
		var thirdParty, onMesh optBool
		var meshDefault *string
		if verb == "update" {
			meshDefault = fs.String("mesh-default", "", "allow or deny: what the project's mesh sandboxes open to each other when no mesh rule of their firewall policy matches")
			fs.Var(&thirdParty, "third-party-default", "true or false: new sandboxes of the project are third-party (they get only environments marked third-party-safe)")
			fs.Var(&onMesh, "mesh", "true or false: new sandboxes of the project are on its private mesh (harebox new --mesh=false keeps one off)")
		}
		var want []string
		switch verb {
		case "create":
			want = []string{"NAME"}
		case "get", "update", "delete":
			want = []string{"REF"}
		}
		pos, err := exactly(fs, c, args, want...)
		if err != nil {
			return 0, err
		}
		q := apiclient.AccountQuery(*account)
		var p apiclient.Project
		switch verb {
		case "create":
			err = c.c.Do(ctx, "POST", apiclient.Path("projects"), q, apiclient.NameRequest{Name: pos[0]}, &p)
		case "get":
			err = c.c.Do(ctx, "GET", apiclient.Path("projects", pos[0]), q, nil, &p)
		case "update":
			u := apiclient.ProjectUpdate{ThirdPartyDefault: thirdParty.v, Mesh: onMesh.v}
			if *meshDefault != "" {
				u.MeshDefault = meshDefault
			}
			if u == (apiclient.ProjectUpdate{}) {
				return 0, usageError{"nothing to change (give --third-party-default or --mesh, true or false, or --mesh-default allow|deny)"}
			}
			err = c.c.Do(ctx, "PATCH", apiclient.Path("projects", pos[0]), q, u, &p)
		case "delete":
			if err := c.c.Do(ctx, "DELETE", apiclient.Path("projects", pos[0]), q, nil, nil); err != nil {
				return 0, err
			}
			return 0, c.deleted("project", pos[0])
		case "list":
			var out struct {
				Projects []apiclient.Project `json:"projects"`
			}
			if err := c.c.Do(ctx, "GET", apiclient.Path("projects"), q, nil, &out); err != nil {
				return 0, err
			}
			return 0, c.printProjects(out, out.Projects...)
		}
		if err != nil {
			return 0, err
		}
		return 0, c.printProjects(p, p)
	}
}

// Fleets.

var cmdFleet = group("fleet", []subcommand{
	{"create", "NAME [--project REF] [--account REF]", "create a fleet in a project", fleetCmd("create")},
	{"list", "[--project REF] [--account REF]", "list a project's fleets", fleetCmd("list")},
	{"get", "REF [--project REF] [--account REF]", "show a fleet (ID or name)", fleetCmd("get")},
	{"delete", "REF [--project REF] [--account REF]", "delete a fleet without live sandboxes", fleetCmd("delete")},
})

func (c *cli) printFleets(v any, fl ...apiclient.Fleet) error {
	var rows [][]string
	for _, f := range fl {
		rows = append(rows, namedRow(f.ID, f.Name, f.CreatedAt))
	}
	return c.show(v, namedHeader, rows)
}

func fleetCmd(verb string) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
		project := fs.String("project", "default", "the project, ID or name")
		account := fs.String("account", "", accountHelp)
		var want []string
		switch verb {
		case "create":
			want = []string{"NAME"}
		case "get", "delete":
			want = []string{"REF"}
		}
		pos, err := exactly(fs, c, args, want...)
		if err != nil {
			return 0, err
		}
		if *project == "" {
			return 0, usageError{"--project must not be empty"}
		}
		q := apiclient.AccountQuery(*account)
		var f apiclient.Fleet
		switch verb {
		case "create":
			err = c.c.Do(ctx, "POST", apiclient.Path("projects", *project, "fleets"), q, apiclient.NameRequest{Name: pos[0]}, &f)
		case "get":
			err = c.c.Do(ctx, "GET", apiclient.Path("projects", *project, "fleets", pos[0]), q, nil, &f)
		case "delete":
			if err := c.c.Do(ctx, "DELETE", apiclient.Path("projects", *project, "fleets", pos[0]), q, nil, nil); err != nil {
				return 0, err
			}
			return 0, c.deleted("fleet", pos[0])
		case "list":
			var out struct {
				Fleets []apiclient.Fleet `json:"fleets"`
			}
			if err := c.c.Do(ctx, "GET", apiclient.Path("projects", *project, "fleets"), q, nil, &out); err != nil {
				return 0, err
			}
			return 0, c.printFleets(out, out.Fleets...)
		}
		if err != nil {
			return 0, err
		}
		return 0, c.printFleets(f, f)
	}
}

// Keys.

var cmdKey = group("key", []subcommand{
	{"create", "[--account REF] [--description TEXT] [--actions A,B] [--sandboxes ID,ID] [--projects P,Q] [--label K=V] [--cidr CIDR] [--rate PER_SECOND[:BURST]] [--budget USD] [--ttl SECONDS]",
		"create a scoped API key (no wider than the key that creates it); prints its secret, shown only once", keyCreate},
	{"list", "[--account REF]", "list the keys (a key sees itself and the keys it created)", keyList},
	{"get", "KEY_ID", "show a key (never its secret)", keyCmd("GET", "")},
	{"revoke", "KEY_ID", "revoke a key and every key it created, at once and for good", keyCmd("DELETE", "")},
	{"rotate", "KEY_ID", "replace a key's secret (the old one stops working); prints the new secret, shown only once", keyCmd("POST", "rotate")},
})

const keyHeader = "ID\tDESCRIPTION\tACTIONS\tEXPIRES\tREVOKED\tHINT"

func keyRow(k apiclient.Key) []string {
	actions := "*"
	if len(k.Scope.Actions) > 0 {
		actions = strings.Join(k.Scope.Actions, ",")
	}
	return []string{k.ID, dash(k.Description), actions, when(k.ExpiresAt), when(k.RevokedAt), k.Hint}
}

// printKey prints one key; in a table, its secret (if any) follows with
// a note that it is shown only once.
func (c *cli) printKey(k apiclient.Key) error {
	if c.output == "json" {
		return c.json(k)
	}
	if err := c.table(keyHeader, [][]string{keyRow(k)}); err != nil {
		return err
	}
	if k.Secret != "" {
		_, err := fmt.Fprintf(c.stdout, "\nSECRET  %s\n(shown only once: store it now; the server keeps only its hash)\n", k.Secret)
		return err
	}
	return nil
}

func keyCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	account := fs.String("account", "", "the key's account, ID or name (the operator only; a key creates keys in its own)")
	description := fs.String("description", "", "what the key is for")
	var actions, sandboxes, projects, cidrs list
	fs.Var(&actions, "actions", "operationIds or groups, comma-separated (e.g. sandboxes:read,exec; default all)")
	fs.Var(&sandboxes, "sandboxes", "the only sandbox IDs the key sees, comma-separated (such a key cannot create sandboxes)")
	fs.Var(&projects, "projects", "the only projects (IDs or names) the key sees and creates in, comma-separated")
	labels := kv{}
	fs.Var(labels, "label", "the key sees only sandboxes with label KEY=VALUE, and those it creates get it (repeatable)")
	fs.Var(&cidrs, "cidr", "where the caller's address must be, e.g. 192.0.2.0/24 (repeatable)")
	rate := fs.String("rate", "", "request rate PER_SECOND[:BURST] (burst default: PER_SECOND rounded up)")
	budgetUSD := fs.String("budget", "", "a dollar limit on what the key may spend, e.g. 25.00")
	ttl := fs.Int64("ttl", 0, "the key expires this many seconds after creation (default never)")
	format := fs.String("format", "", `the secret's form: harebox ("hbk_...", the default) or e2b ("e2b_" and hex digits, which some E2B SDK versions require)`)
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	req := apiclient.KeyRequest{AccountID: *account, Description: *description, TTLSeconds: *ttl, Format: *format,
		Scope: authz.Scope{Actions: actions, Sandboxes: sandboxes, Projects: projects, CIDRs: cidrs}}
	if len(labels) > 0 {
		req.Scope.Labels = labels
	}
	if *rate != "" {
		r, err := parseRate(*rate)
		if err != nil {
			return 0, usageError{err.Error()}
		}
		req.Scope.Rate = r
	}
	if *budgetUSD != "" {
		b, err := money.ParseUSD(strings.TrimPrefix(*budgetUSD, "$"))
		if err != nil {
			return 0, usageError{"--budget: " + err.Error()}
		}
		req.Scope.Budget = &b
	}
	var k apiclient.Key
	if err := c.c.Do(ctx, "POST", apiclient.Path("keys"), nil, req, &k); err != nil {
		return 0, err
	}
	return 0, c.printKey(k)
}

// parseRate parses PER_SECOND[:BURST].
func parseRate(s string) (*authz.Rate, error) {
	ps, bs, hasBurst := strings.Cut(s, ":")
	per, err := strconv.ParseFloat(ps, 64)
	if err != nil || !(per > 0) || math.IsInf(per, 0) {
		return nil, fmt.Errorf("--rate %q: want PER_SECOND[:BURST], PER_SECOND above 0", s)
	}
	burst := int(math.Max(1, math.Ceil(per)))
	if hasBurst {
		if burst, err = strconv.Atoi(bs); err != nil || burst < 1 {
			return nil, fmt.Errorf("--rate %q: BURST must be a whole number of at least 1", s)
		}
	}
	return &authz.Rate{PerSecond: per, Burst: burst}, nil
}

func keyList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	account := fs.String("account", "", "only this account's keys, ID or name (the operator only; default: every account's)")
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var out struct {
		Keys []apiclient.Key `json:"keys"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("keys"), apiclient.AccountQuery(*account), nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, k := range out.Keys {
		rows = append(rows, keyRow(k))
	}
	return 0, c.show(out, keyHeader, rows)
}

func keyCmd(method, suffix string) func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	return func(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
		pos, err := exactly(fs, c, args, "KEY_ID")
		if err != nil {
			return 0, err
		}
		parts := []string{"keys", pos[0]}
		if suffix != "" {
			parts = append(parts, suffix)
		}
		var k apiclient.Key
		if err := c.c.Do(ctx, method, apiclient.Path(parts...), nil, nil, &k); err != nil {
			return 0, err
		}
		return 0, c.printKey(k)
	}
}
