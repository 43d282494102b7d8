// Command harebox is the HareBox CLI: a thin client of the REST API. It
// prints JSON by default (so `| jq -r .id` works) and a table with
// --output table.
//
//	ID=$(harebox new --name untrusted --size small --no-env --ttl 900 | jq -r .id)
//	harebox exec "$ID" --timeout 300 -- python3 /home/user/job.py
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/internal/docslink"
	"github.com/harebox/harebox/sandbox"
)

// version is set at build time.
var version = "dev"

// maxStdin bounds the stdin `harebox exec` forwards.
const maxStdin = 16 << 20

// usageError is a wrong invocation: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

type cli struct {
	c      *apiclient.Client
	output string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

type command struct {
	name, args, help string
	run              func(ctx context.Context, c *cli, args []string) (exit int, err error)
}

var commands = []command{
	{"new", "[flags]", "create a sandbox", cmdNew},
	{"get", "ID", "show a sandbox", cmdGet},
	{"list", "[flags]", "list sandboxes", cmdList},
	{"delete", "ID", "delete a sandbox", cmdDelete},
	{"pause", "ID", "pause a sandbox", cmdPause},
	{"resume", "ID", "resume a paused or hibernated sandbox", cmdResume},
	{"stop", "ID", "shut a sandbox down and keep its disk (start boots it again; what ran is gone)", cmdStop},
	{"start", "ID", "boot a stopped sandbox again on its disk", cmdStart},
	{"timeout", "ID DURATION", "set when a running or paused sandbox expires: DURATION from now (a Go duration such as 10m, or seconds), or never for 0", cmdTimeout},
	{"hibernate", "ID", "write a sandbox's memory to disk and free its host RAM (resume restores it, after a restart or reboot too)", cmdHibernate},
	{"move", "ID --to HOST", "move a running, paused, hibernated or stopped sandbox to another host of the deployment, as it was (its processes run on; a stopped one's disk goes): prints it, the hosts and how long it did not run (the operator only)", cmdMove},
	{"fork", "ID [--count N] [--name NAME] [--label K=V] [--ttl SECS] [--volume NAME:/PATH[:ro] | --no-volumes]", "make N clones of a running or paused sandbox, each with its own ID, keys, machine-id, entropy and network", cmdFork},
	{"url", "create ID --port PORT [--auth token|oidc|mtls] | list ID | get ID URL_ID | rotate ID URL_ID | delete ID URL_ID | ca get|create|upload FILE|delete | cert issue NAME|list|revoke SERIAL", "publish a sandbox's port on the server's ingress, behind a token, OpenID Connect or client certificates; a project's URL CA and its client certificates", cmdURL},
	{"snapshot", "create ID [--name NAME] | list [--sandbox ID] | get SNAPSHOT_ID | delete SNAPSHOT_ID", "snapshots of sandboxes; harebox new --snapshot SNAPSHOT_ID makes a sandbox from one", cmdSnapshot},
	{"image", "list | build NAME --from registry:REF | delete NAME", "the images sandboxes are made from (harebox new --image NAME)", cmdImage},
	{"exec", "ID [flags] -- COMMAND [ARG...]", "run a command, streaming its output; exits with its exit code (--background: start it and print its process)", cmdExec},
	{"shell", "ID [-c CMD] [--user U] [--cwd DIR]", "an interactive terminal in the sandbox (the local one in raw mode until it ends); exits with the shell's exit code", cmdShell},
	{"run-code", "ID [--context C] [--language python|javascript|typescript|bash] [-c CODE | --file F | stdin] [--env K=V] [--timeout SECS] [--save-results DIR]", "run a cell in the sandbox's code interpreter (an image with one: code-interpreter), whose state lasts from one cell to the next: its output streamed, its value printed, charts and other rich results saved with --save-results; exits 1 if it raised, 124 if it timed out, 125 if its kernel died", cmdRunCode},
	{"code-context", "create ID [--language L] [--cwd DIR] [--env K=V] | list ID | restart ID CONTEXT | delete ID CONTEXT", "the code interpreter's contexts: a kernel each, with its own state", cmdCodeContext},
	{"ps", "ID", "a sandbox's background processes (they run on when the client or the server goes away)", cmdPs},
	{"attach", "ID PROC [--no-follow] [--stdout-offset N] [--stderr-offset N]", "a background process's output, kept in the guest, then (unless --no-follow) what comes until it ends; exits with its exit code", cmdAttach},
	{"kill", "ID PROC [--signal N]", "signal a background process's process group (default SIGKILL)", cmdKill},
	{"file", "write|read|list|stat|mkdir|rm ID --path PATH [flags]", "files in a sandbox", cmdFile},
	{"firewall", "set|get ID [--body JSON | --from FILE]", "a sandbox's firewall policy", cmdFirewall},
	{"history", "ID [--limit N]", "a sandbox's command history, oldest first (kept as its account's retention says)", cmdHistory},
	{"account", "create NAME | list | get REF | update REF [--history-days N] [--output-days N] [--keep-forever] | delete REF", "accounts and their command-history retention (create and delete: the operator only)", cmdAccount},
	{"project", "create NAME | list | get REF | update REF [--third-party-default=BOOL] [--mesh=BOOL] [--mesh-default allow|deny] | delete REF [--account REF]", "an account's projects", cmdProject},
	{"fleet", "create NAME | list | get REF | delete REF [--project REF] [--account REF]", "a project's fleets (default project: default)", cmdFleet},
	{"volume", "create NAME --size GB | list | get NAME | resize NAME --size GB | delete NAME [--project REF] [--account REF]", "a project's volumes: disks that outlive sandboxes, encrypted under their own keys", cmdVolume},
	{"env", "create NAME [flags] | set NAME [flags] | get NAME | list | versions NAME | version NAME N | delete NAME [--project REF] [--account REF]", "a project's environments: versioned variables (secrets sealed), files and credential rules that sandboxes pin", cmdEnv},
	{"key", "create [flags] | list | get KEY_ID | revoke KEY_ID | rotate KEY_ID", "scoped API keys; a new or rotated secret is shown once", cmdKey},
	{"audit", "list [filters] [--limit N] [--after CURSOR] | export [filters] | verify | key", "the audit log: who did what, denied attempts too; export as JSON Lines, verify its hash chain and signed checkpoints", cmdAudit},
	{"budget", "create [flags] | list | get BUDGET_ID | delete BUDGET_ID", "dollar limits on an account, project, fleet, label or key, with an action when reached", cmdBudget},
	{"usage", "[--from TIME] [--to TIME] [--group-by G] [--account REF]", "metered usage and its cost, grouped by account, project, fleet, key, sandbox or label:KEY", cmdUsage},
	{"events", "[--follow] [--after CURSOR] [--limit N] [--account REF]", "what happened on the engine's side: budget warnings and actions, guests using placeholders, VMs that stopped on their own; --follow prints them as they happen", cmdEvents},
	{"metrics", "ID [--from TIME] [--to TIME] [--limit N] | --server", "a sandbox's monitoring samples (CPU, memory, disk, network, measured on the host), or the server's metrics in the Prometheus text format", cmdMetrics},
	{"mcp", "", "serve the Model Context Protocol on stdin/stdout for an agent framework: tools to create, list and delete sandboxes, run commands and read and write files, each called with this CLI's key", cmdMCP},
	{"mesh", "[status] | rotate-key HOST", "the mesh's tunnels between the hosts (hareboxd --mesh-endpoint): each host's endpoint and key, and its tunnel to each other host with its last handshake and bytes, as each host last reported them; rotate-key has HOST make a new key (the operator only)", cmdMesh},
	{"hosts", "[list] | remove NAME | drain NAME | undrain NAME", "the hosts of the deployment (hareboxd that share a PostgreSQL store), up or down, with what they run and their leases; remove takes one that is down out for good, deleting its sandboxes; drain takes no new sandbox on one and moves its sandboxes to the others (printing what moved where and what stayed, with why), undrain ends that (the operator only)", cmdHosts},
	{"pool", "[show] | set IMAGE:PRESET=N... | reset", "the warm pool: idle sandboxes restored from the golden snapshot, kept on each host for creates of that image and size to claim; show prints it as the host that answers keeps it; set makes it the same on every host of the deployment (0 to 64 each; none given: no pool); reset gives each host back its own hareboxd --pool (the operator only)", cmdPool},
	{"version", "", "client and server versions", cmdVersion},
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	global := flag.NewFlagSet("harebox", flag.ContinueOnError)
	global.SetOutput(stderr)
	urlFlag := global.String("url", "", "server URL (default $HAREBOX_URL, else http://127.0.0.1:7070; unix:/path for a socket)")
	keyFlag := global.String("api-key", "", "API key (default $HAREBOX_API_KEY)")
	caFlag := global.String("ca", "", "how an https server is trusted (default $HAREBOX_CA): a PEM file of CA certificates, or sha256:FINGERPRINT of the server's certificate")
	output := global.String("output", "json", "output format: json or table")
	global.Usage = func() {
		fmt.Fprintf(stderr, "usage: harebox [--url URL] [--api-key KEY] [--ca FILE|sha256:FP] [--output json|table] COMMAND ...\n\ncommands:\n")
		for _, c := range commands {
			fmt.Fprintf(stderr, "  %-9s %s\n            %s\n", c.name, c.args, c.help)
		}
		fmt.Fprintf(stderr, "\n'harebox COMMAND --help' describes a command.\n")
	}
	if err := global.Parse(hoistGlobals(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if global.NArg() == 0 {
		global.Usage()
		return 2
	}
	if *output != "json" && *output != "table" {
		fmt.Fprintf(stderr, "harebox: --output %q: want json or table\n", *output)
		return 2
	}
	name, rest := global.Arg(0), global.Args()[1:]
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "harebox: unknown command %q (see harebox --help)\n", name)
		return 2
	}
	c, err := apiclient.Open(apiclient.Options{URL: *urlFlag, Key: *keyFlag, CA: *caFlag})
	if err != nil {
		fmt.Fprintln(stderr, "harebox:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := cmd.run(ctx, &cli{c: c, output: *output, stdin: stdin, stdout: stdout, stderr: stderr}, rest)
	usage := cmd.args
	var ue usageError
	var se subError
	if errors.As(err, &se) { // harebox key create ...
		name, usage = name+" "+se.sub, se.args
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "harebox %s: %s (usage: harebox %s %s)\n", name, ue.msg, name, usage)
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "harebox %s: %s%s\n", name, oneLine(err.Error()), hint(err))
		return 1
	}
	return code
}

// hint points an error at the docs page that answers what it leaves
// open, if one does: what a key is and may do, how an image is built.
func hint(err error) string {
	var ae *apiclient.Error
	switch {
	case errors.Is(err, sandbox.ErrUnauthenticated):
		return docslink.See(docslink.Keys)
	case errors.Is(err, sandbox.ErrForbidden):
		return docslink.See(docslink.ScopedKeys)
	case errors.As(err, &ae) && ae.Field == "image" && errors.Is(err, sandbox.ErrInvalid):
		return docslink.See(docslink.Images)
	}
	return ""
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// hoistGlobals moves the global flags to the front, so that they may also
// follow the command (harebox new --url URL ...). Nothing after "--" moves.
func hoistGlobals(args []string) []string {
	var globals, rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && (name == "url" || name == "api-key" || name == "ca" || name == "output") {
			globals = append(globals, a)
			if !hasValue && i+1 < len(args) {
				globals = append(globals, args[i+1])
				i++
			}
			continue
		}
		rest = append(rest, a)
	}
	return append(globals, rest...)
}

// parse parses a subcommand's flags, which may come after its positional
// arguments (harebox exec ID --timeout 300 -- cmd). It returns the
// positionals; wantPos is how many are required.
func parse(fs *flag.FlagSet, c *cli, args []string, wantPos int) ([]string, error) {
	// Errors are reported in one line by run; the flag list only on --help.
	fs.SetOutput(io.Discard)
	var pos []string
	for len(args) > 0 {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(c.stderr)
				fmt.Fprintf(c.stderr, "usage: %s\n", fs.Name())
				fs.PrintDefaults()
				return nil, err
			}
			return nil, usageError{err.Error()}
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		if len(pos) >= wantPos || args[0] == "--" {
			pos = append(pos, args...)
			break
		}
		pos, args = append(pos, args[0]), args[1:]
	}
	if len(pos) < wantPos {
		return nil, usageError{fmt.Sprintf("missing argument (want %d)", wantPos)}
	}
	return pos, nil
}

// kv collects repeated KEY=VALUE flags.
type kv map[string]string

func (m kv) String() string { return "" }
func (m kv) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	m[k] = v
	return nil
}

func cmdNew(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox new", flag.ContinueOnError)
	name := fs.String("name", "", "sandbox name")
	size := fs.String("size", "", "size preset: small, medium or large")
	vcpus := fs.Int("vcpus", 0, "custom vCPUs (with --memory)")
	memory := fs.Int("memory", 0, "custom memory in MB (with --vcpus)")
	disk := fs.Int("disk", 0, "custom disk in GB")
	image := fs.String("image", "", "image (default: the server's default)")
	ttl := fs.Int64("ttl", 0, "delete the sandbox this many seconds after creation")
	noEnv := fs.Bool("no-env", false, "keep every stored environment out of this sandbox")
	noMonitoring := fs.Bool("no-monitoring", false, "keep no command history for this sandbox (harebox history then shows none)")
	noSnapshots := fs.Bool("no-snapshots", false, "refuse every snapshot and fork of this sandbox")
	thirdParty := fs.Bool("third-party", false, "a sandbox handed to a third party: it may only get an environment marked third-party-safe (a project's third-party default also makes it so)")
	project := fs.String("project", "", "the project, ID or name (default: the account's default project)")
	fleet := fs.String("fleet", "", "a fleet of that project, ID or name")
	account := fs.String("account", "", "the account, ID or name (the operator only; default: the default account, or the key's own)")
	fw := fs.String("firewall", "", "the firewall policy, in force before the VM boots: JSON, or @FILE (default: the server's default policy)")
	fromSnap := fs.String("snapshot", "", "make the sandbox from this snapshot (memory, processes and disk as they were; its image and size)")
	var onMesh optBool
	fs.Var(&onMesh, "mesh", "true or false: put the sandbox on its project's private mesh, or keep it off (default: as the project says)")
	site := fs.String("site", "", "run it in this site (e.g. fr-par-1), on a host of the deployment there (default: the site of the host that takes the create)")
	country := fs.String("country", "", "run it in this country (ISO 3166-1 alpha-2, e.g. FR), in any site there")
	var vols volumeMounts
	fs.Var(&vols, "volume", "NAME:/PATH[:ro]: attach a volume of the project there (repeatable; one writer at a time; a reader sees it as it was when it attached)")
	labels, env := kv{}, &envFlag{vars: kv{}}
	fs.Var(labels, "label", "label KEY=VALUE (repeatable)")
	fs.Var(env, "env", "KEY=VALUE: an environment variable of this sandbox only (repeatable);\n"+
		"NAME[@VERSION] or an env_ ID (no '='): pin that environment of the project, its latest version\n"+
		"unless @VERSION is given (at most one; see harebox env)")
	if _, err := parse(fs, c, args, 0); err != nil {
		return 0, err
	}
	environment, err := env.environment()
	if err != nil {
		return 0, err
	}
	req := sandbox.CreateRequest{
		Name: *name, Image: *image, TTLSeconds: *ttl, NoEnv: *noEnv,
		AccountID: *account, Project: *project, Fleet: *fleet,
		Environment: environment, ThirdParty: *thirdParty, Snapshot: *fromSnap,
		Size: sandbox.Size{Preset: *size, VCPUs: *vcpus, MemoryMB: *memory, DiskGB: *disk},
	}
	if *noMonitoring {
		req.Monitoring = new(bool)
	}
	if *noSnapshots {
		req.Snapshots = new(bool)
	}
	req.Mesh = onMesh.v
	req.Site, req.Country = *site, *country
	req.Volumes = vols
	if len(labels) > 0 {
		req.Labels = labels
	}
	if len(env.vars) > 0 {
		req.Env = env.vars
	}
	if *fw != "" {
		policy := []byte(*fw)
		if path, ok := strings.CutPrefix(*fw, "@"); ok {
			if policy, err = os.ReadFile(path); err != nil {
				return 0, usageError{"--firewall: " + err.Error()}
			}
		}
		if !json.Valid(policy) {
			return 0, usageError{"--firewall: not JSON (give a policy, or @FILE)"}
		}
		req.Firewall = policy
	}
	var box sandbox.Sandbox
	if err := c.c.Do(ctx, "POST", "/v1/sandboxes", nil, req, &box); err != nil {
		return 0, err
	}
	return 0, c.printSandboxes(box)
}

func oneID(ctx context.Context, c *cli, name string, args []string) (string, error) {
	fs := flag.NewFlagSet("harebox "+name+" ID", flag.ContinueOnError)
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		return "", usageError{"want exactly one sandbox ID"}
	}
	return pos[0], nil
}

func sandboxCmd(name, method, suffix string) func(ctx context.Context, c *cli, args []string) (int, error) {
	return func(ctx context.Context, c *cli, args []string) (int, error) {
		id, err := oneID(ctx, c, name, args)
		if err != nil {
			return 0, err
		}
		var box sandbox.Sandbox
		if err := c.c.Do(ctx, method, apiclient.SandboxPath(id, suffix), nil, nil, &box); err != nil {
			return 0, err
		}
		return 0, c.printSandboxes(box)
	}
}

var (
	cmdGet       = sandboxCmd("get", "GET", "")
	cmdDelete    = sandboxCmd("delete", "DELETE", "")
	cmdPause     = sandboxCmd("pause", "POST", "/pause")
	cmdResume    = sandboxCmd("resume", "POST", "/resume")
	cmdStop      = sandboxCmd("stop", "POST", "/stop")
	cmdHibernate = sandboxCmd("hibernate", "POST", "/hibernate")
	cmdStart     = sandboxCmd("start", "POST", "/start")
)

// cmdMove moves a sandbox to another host.
func cmdMove(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox move ID", flag.ContinueOnError)
	to := fs.String("to", "", "the host to move it to (harebox hosts lists them)")
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	if len(pos) != 1 || *to == "" {
		return 0, usageError{"want a sandbox ID and --to HOST"}
	}
	res, err := c.c.Move(ctx, pos[0], *to)
	if err != nil {
		return 0, err
	}
	return 0, c.json(res)
}

// cmdTimeout sets a sandbox's TTL from now.
func cmdTimeout(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox timeout", flag.ContinueOnError)
	pos, err := parse(fs, c, args, 2)
	if err != nil {
		return 0, err
	}
	if len(pos) != 2 {
		return 0, usageError{"want a sandbox ID and a duration"}
	}
	ttl, err := parseTTL(pos[1])
	if err != nil {
		return 0, usageError{err.Error()}
	}
	box, err := c.c.SetTimeout(ctx, pos[0], ttl)
	if err != nil {
		return 0, err
	}
	return 0, c.printSandboxes(*box)
}

// parseTTL reads a Go duration ("90s", "2h") or whole seconds ("90").
func parseTTL(s string) (time.Duration, error) {
	if n, err := strconv.ParseInt(s, 10, 64); err == nil {
		if n < 0 || n > int64(sandbox.MaxTTL/time.Second) {
			return 0, fmt.Errorf("duration %q: want 0 to %d seconds", s, int64(sandbox.MaxTTL/time.Second))
		}
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want seconds or a Go duration such as 10m", s)
	}
	return d, nil
}

func cmdList(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox list", flag.ContinueOnError)
	state := fs.String("state", "", "only sandboxes in this state")
	account := fs.String("account", "", "only sandboxes of this account, ID or name (the operator only)")
	project := fs.String("project", "", "only sandboxes in this project, ID or name")
	fleet := fs.String("fleet", "", "only sandboxes in this fleet, ID or name (of --project, default the default project)")
	labels := kv{}
	fs.Var(labels, "label", "only sandboxes with label KEY=VALUE (repeatable)")
	if _, err := parse(fs, c, args, 0); err != nil {
		return 0, err
	}
	q := url.Values{}
	if *state != "" {
		q.Set("state", *state)
	}
	if *account != "" {
		q.Set("account", *account)
	}
	if *project != "" {
		q.Set("project", *project)
	}
	if *fleet != "" {
		q.Set("fleet", *fleet)
	}
	for k, v := range labels {
		q.Add("label", k+"="+v)
	}
	var out struct {
		Sandboxes []sandbox.Sandbox `json:"sandboxes"`
	}
	if err := c.c.Do(ctx, "GET", "/v1/sandboxes", q, nil, &out); err != nil {
		return 0, err
	}
	if c.output == "json" {
		return 0, c.json(out)
	}
	return 0, c.printSandboxes(out.Sandboxes...)
}

func cmdExec(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox exec", flag.ContinueOnError)
	timeout := fs.Float64("timeout", 0, "seconds before the command's process group is killed (default 300)")
	user := fs.String("user", "", `user to run as (default "user"; "root" for root)`)
	cwd := fs.String("cwd", "", "working directory")
	shell := fs.String("c", "", "run this shell string instead of COMMAND ARG...")
	env := kv{}
	fs.Var(env, "env", "environment variable KEY=VALUE (repeatable)")
	background := fs.Bool("background", false, "start the command as a background process and print it (its output: harebox attach ID PROC)")
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	id, argv := pos[0], pos[1:]
	if len(argv) > 0 && argv[0] == "--" {
		argv = argv[1:]
	}
	req := sandbox.ExecRequest{Argv: argv, Cmd: *shell, TimeoutSeconds: *timeout, User: *user, Cwd: *cwd}
	if (len(argv) == 0) == (*shell == "") {
		return 0, usageError{"give a command after --, or -c 'shell string'"}
	}
	if len(env) > 0 {
		req.Env = env
	}
	// Piped stdin streams to the command as it comes (its end closes the
	// command's stdin); a terminal is not read.
	f, isFile := c.stdin.(*os.File)
	piped := !isFile || !isTerminal(f)
	if *background && piped {
		b, err := io.ReadAll(io.LimitReader(c.stdin, maxStdin+1))
		if err != nil {
			return 0, err
		}
		if len(b) > maxStdin {
			return 0, fmt.Errorf("stdin is larger than %d bytes; write it to a file in the sandbox instead", maxStdin)
		}
		if len(b) > 0 {
			req.Stdin = b
		}
	}
	if piped && !*background {
		return execStreamingStdin(ctx, c, id, req)
	}
	if *background {
		var p sandbox.Process
		if err := c.c.Do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/processes", nil, req, &p); err != nil {
			return 0, err
		}
		return 0, c.json(p)
	}
	res, err := c.c.ExecStream(ctx, id, req, c.stdout, c.stderr)
	if err != nil {
		return 0, err
	}
	return c.exitCode("exec", res), nil
}

// exitCode is a command's result as this program's exit code, as a shell
// gives it (124 on timeout, 127 when it could not start, 128+N for a
// signal), with a line on stderr for the first two.
func (c *cli) exitCode(name string, res *sandbox.ExecResult) int {
	switch {
	case res.Error != "":
		fmt.Fprintf(c.stderr, "harebox %s: %s\n", name, oneLine(res.Error))
		return 127
	case res.TimedOut:
		fmt.Fprintf(c.stderr, "harebox %s: timed out after %.0f s; the command's process group was killed\n", name, float64(res.DurationMS)/1000)
		return 124
	case res.Signal != 0:
		return 128 + res.Signal
	}
	return res.ExitCode
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func cmdFile(ctx context.Context, c *cli, args []string) (int, error) {
	if helpOnly(c, "file write|read|list|stat|mkdir|rm ID --path PATH [flags] (harebox file SUB --help: its flags)", args) {
		return 0, flag.ErrHelp
	}
	if len(args) == 0 {
		return 0, usageError{"want a subcommand: write, read, list, stat, mkdir or rm"}
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("harebox file "+sub, flag.ContinueOnError)
	path := fs.String("path", "", "absolute path in the sandbox")
	from := fs.String("from", "", "write: local file to upload (- for stdin)")
	to := fs.String("to", "", "read: local file to write (default stdout)")
	mode := fs.String("mode", "", "write, mkdir: octal mode, e.g. 0644")
	parents := fs.Bool("parents", false, "write: create missing parent directories")
	recursive := fs.Bool("recursive", false, "rm: remove a directory and its content")
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	if *path == "" {
		return 0, usageError{"--path is required"}
	}
	id := pos[0]
	q := url.Values{"path": {*path}}
	if *mode != "" {
		q.Set("mode", *mode)
	}
	files := apiclient.SandboxPath(id, "/files")
	switch sub {
	case "write":
		if *from == "" {
			return 0, usageError{"--from FILE (or - for stdin) is required"}
		}
		var src io.Reader = c.stdin
		if *from != "-" {
			f, err := os.Open(*from)
			if err != nil {
				return 0, err
			}
			defer f.Close()
			src = f
		}
		if *parents {
			q.Set("make_parents", "true")
		}
		var fi sandbox.FileInfo
		if err := c.c.Do(ctx, "PUT", files, q, src, &fi); err != nil {
			return 0, err
		}
		return 0, c.json(fi)
	case "read":
		w := c.stdout
		if *to != "" {
			var buf bytes.Buffer
			if err := c.c.Do(ctx, "GET", files, q, nil, &buf); err != nil {
				return 0, err
			}
			return 0, os.WriteFile(*to, buf.Bytes(), 0o644)
		}
		return 0, c.c.Do(ctx, "GET", files, q, nil, w)
	case "list":
		var out struct {
			Entries   []sandbox.FileInfo `json:"entries"`
			Truncated bool               `json:"truncated"`
		}
		if err := c.c.Do(ctx, "GET", files+"/list", q, nil, &out); err != nil {
			return 0, err
		}
		if c.output == "table" {
			tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "MODE\tSIZE\tOWNER\tNAME")
			for _, e := range out.Entries {
				fmt.Fprintf(tw, "%s %04o\t%d\t%d:%d\t%s\n", e.Type, e.Mode, e.Size, e.UID, e.GID, e.Name)
			}
			return 0, tw.Flush()
		}
		return 0, c.json(out)
	case "stat":
		var fi sandbox.FileInfo
		if err := c.c.Do(ctx, "GET", files+"/stat", q, nil, &fi); err != nil {
			return 0, err
		}
		return 0, c.json(fi)
	case "mkdir":
		var fi sandbox.FileInfo
		if err := c.c.Do(ctx, "POST", files+"/mkdir", q, nil, &fi); err != nil {
			return 0, err
		}
		return 0, c.json(fi)
	case "rm":
		if *recursive {
			q.Set("recursive", "true")
		}
		if err := c.c.Do(ctx, "DELETE", files, q, nil, nil); err != nil {
			return 0, err
		}
		return 0, c.json(map[string]string{"removed": *path})
	}
	return 0, usageError{fmt.Sprintf("unknown file subcommand %q", sub)}
}

func cmdFirewall(ctx context.Context, c *cli, args []string) (int, error) {
	if helpOnly(c, "firewall set|get ID [--body JSON | --from FILE]", args) {
		return 0, flag.ErrHelp
	}
	if len(args) == 0 {
		return 0, usageError{"want a subcommand: set or get"}
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("harebox firewall "+sub, flag.ContinueOnError)
	body := fs.String("body", "", "set: the policy as JSON")
	from := fs.String("from", "", "set: a file holding the policy")
	pos, err := parse(fs, c, args, 1)
	if err != nil {
		return 0, err
	}
	path := apiclient.SandboxPath(pos[0], "/firewall")
	var policy json.RawMessage
	switch sub {
	case "get":
		err = c.c.Do(ctx, "GET", path, nil, nil, &policy)
	case "set":
		doc := []byte(*body)
		if *from != "" {
			if doc, err = os.ReadFile(*from); err != nil {
				return 0, err
			}
		}
		if len(doc) == 0 {
			return 0, usageError{"--body JSON or --from FILE is required"}
		}
		err = c.c.Do(ctx, "PUT", path, nil, doc, &policy)
	default:
		return 0, usageError{fmt.Sprintf("unknown firewall subcommand %q", sub)}
	}
	if err != nil {
		return 0, err
	}
	return 0, c.json(policy)
}

// helpOnly answers --help for a command without flags: its usage, on
// stdout.
func helpOnly(c *cli, usage string, args []string) bool {
	if len(args) != 1 || !isHelp(args[0]) {
		return false
	}
	fmt.Fprintf(c.stdout, "usage: harebox %s\n", usage)
	return true
}

func isHelp(a string) bool { return a == "-h" || a == "-help" || a == "--help" }

func cmdHosts(ctx context.Context, c *cli, args []string) (int, error) {
	// (These take no flags: --help anywhere is a call for help, never a
	// host's name.)
	if slices.ContainsFunc(args, isHelp) && helpOnly(c, "hosts [list] | remove NAME | drain NAME | undrain NAME", []string{"--help"}) {
		return 0, flag.ErrHelp
	}
	var out json.RawMessage
	switch {
	case len(args) == 0 || (len(args) == 1 && args[0] == "list"):
		if err := c.c.Do(ctx, "GET", "/v1/hosts", nil, nil, &out); err != nil {
			return 0, err
		}
	case len(args) == 2 && args[0] == "remove":
		if err := c.c.Do(ctx, "DELETE", "/v1/hosts/"+url.PathEscape(args[1]), nil, nil, &out); err != nil {
			return 0, err
		}
	case len(args) == 2 && (args[0] == "drain" || args[0] == "undrain"):
		// (A drain moves every sandbox of the host, one by one.)
		ctx, cancel := context.WithTimeout(ctx, time.Hour)
		defer cancel()
		if err := c.c.Do(ctx, "POST", "/v1/hosts/"+url.PathEscape(args[1])+"/"+args[0], nil, nil, &out); err != nil {
			return 0, err
		}
	default:
		return 2, errors.New("usage: harebox hosts [list] | remove NAME | drain NAME | undrain NAME")
	}
	return 0, c.json(out)
}

func cmdMesh(ctx context.Context, c *cli, args []string) (int, error) {
	if slices.ContainsFunc(args, isHelp) && helpOnly(c, "mesh [status] | rotate-key HOST", []string{"--help"}) {
		return 0, flag.ErrHelp
	}
	switch {
	case len(args) == 2 && args[0] == "rotate-key":
		var out json.RawMessage
		if err := c.c.Do(ctx, "POST", "/v1/hosts/"+url.PathEscape(args[1])+"/mesh-key", nil, nil, &out); err != nil {
			return 0, err
		}
		return 0, c.json(out)
	case len(args) == 0 || (len(args) == 1 && args[0] == "status"):
	default:
		return 2, errors.New("usage: harebox mesh [status] | rotate-key HOST")
	}
	// (The fields printed of GET /v1/hosts' Host and HostMesh.)
	var out struct {
		Hosts []struct {
			Name string `json:"name"`
			Mesh *struct {
				PublicKey  string    `json:"public_key"`
				Endpoint   string    `json:"endpoint"`
				ReportedAt time.Time `json:"reported_at"`
				Tunnels    []struct {
					Host          string    `json:"host"`
					LastHandshake time.Time `json:"last_handshake"`
					RxBytes       uint64    `json:"rx_bytes"`
					TxBytes       uint64    `json:"tx_bytes"`
				} `json:"tunnels"`
			} `json:"mesh"`
		} `json:"hosts"`
	}
	var raw json.RawMessage
	if err := c.c.Do(ctx, "GET", "/v1/hosts", nil, nil, &raw); err != nil {
		return 0, err
	}
	if c.output == "json" {
		return 0, c.json(raw)
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return 0, err
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tENDPOINT\tKEY\tTO\tHANDSHAKE\tRX\tTX\tREPORTED")
	for _, h := range out.Hosts {
		if h.Mesh == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\n", h.Name)
			continue
		}
		m := h.Mesh
		ago := func(t time.Time) string {
			if t.IsZero() {
				return "never"
			}
			return time.Since(t).Round(time.Second).String() + " ago"
		}
		if len(m.Tunnels) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t%.8s\t-\t-\t-\t-\t%s\n", h.Name, m.Endpoint, m.PublicKey, ago(m.ReportedAt))
		}
		for _, tu := range m.Tunnels {
			fmt.Fprintf(tw, "%s\t%s\t%.8s\t%s\t%s\t%d\t%d\t%s\n", h.Name, m.Endpoint, m.PublicKey, dash(tu.Host), ago(tu.LastHandshake), tu.RxBytes, tu.TxBytes, ago(m.ReportedAt))
		}
	}
	return 0, tw.Flush()
}

func cmdVersion(ctx context.Context, c *cli, args []string) (int, error) {
	fs := flag.NewFlagSet("harebox version", flag.ContinueOnError)
	if _, err := parse(fs, c, args, 0); err != nil {
		return 0, err
	}
	out := map[string]any{"client": version}
	var info json.RawMessage
	if err := c.c.Do(ctx, "GET", "/v1/info", nil, nil, &info); err != nil {
		out["server_error"] = err.Error()
	} else {
		out["server"] = info
	}
	return 0, c.json(out)
}

func (c *cli) json(v any) error {
	enc := json.NewEncoder(c.stdout)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func (c *cli) printSandboxes(boxes ...sandbox.Sandbox) error {
	if c.output == "json" {
		if len(boxes) == 1 {
			return c.json(boxes[0])
		}
		return c.json(boxes)
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tIMAGE\tSIZE\tSITE\tAGE\tEXPIRES\tLABELS")
	for _, b := range boxes {
		exp := "-"
		if b.ExpiresAt != nil {
			exp = time.Until(*b.ExpiresAt).Round(time.Second).String()
		}
		var ls []string
		for k, v := range b.Labels {
			ls = append(ls, k+"="+v)
		}
		sort.Strings(ls)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%svCPU/%sMB\t%s\t%s\t%s\t%s\n", b.ID, dash(b.Name), b.State, b.Image,
			strconv.Itoa(b.Size.VCPUs), strconv.Itoa(b.Size.MemoryMB), b.Site.Name,
			time.Since(b.CreatedAt).Round(time.Second), exp, dash(strings.Join(ls, ",")))
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
