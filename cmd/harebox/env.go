package main

// harebox env: a project's environments, named and versioned sets of
// variables (secret ones sealed in the server, never shown again), files
// and credential rules that sandboxes pin at create (harebox new --env
// NAME[@VERSION]).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/harebox/harebox/apiclient"
)

var cmdEnv = group("env", []subcommand{
	{"create", "NAME [--project REF] [--account REF] [--var KEY=VALUE] [--secret KEY=VALUE] [--secret-from-env KEY] [--file GUEST_PATH=LOCAL_PATH] [--template-file GUEST_PATH=LOCAL_PATH] [--credential RULE] [--third-party-safe]",
		"create an environment and its version 1; secret values are sealed in the server and never shown again", envCreate},
	{"set", "NAME [--var KEY=VALUE] [--secret KEY=VALUE] [--secret-from-env KEY] [--unset KEY] [--file ... | --no-files] [--template-file ...] [--credential RULE | --no-credentials] [--third-party-safe=true|false] [--project REF] [--account REF]",
		"make a new version from the latest one (running sandboxes keep the version they pinned)", envSet},
	{"get", "NAME [--project REF] [--account REF]", "show an environment (name or ID) with its latest version; secrets show no value", envGet},
	{"list", "[--project REF] [--account REF]", "list a project's environments", envList},
	{"versions", "NAME [--project REF] [--account REF]", "list an environment's versions, oldest first", envVersions},
	{"version", "NAME N [--project REF] [--account REF]", "show version N of an environment", envVersion},
	{"delete", "NAME [--project REF] [--account REF]", "delete an environment no live sandbox pinned, with its versions and sealed values", envDelete},
})

const projectHelp = "the project, ID or name (default: the account's default project)"

// envFlags adds --project and --account and returns their query.
func envFlags(fs *flag.FlagSet) func() url.Values {
	project := fs.String("project", "", projectHelp)
	account := fs.String("account", "", accountHelp)
	return func() url.Values { return apiclient.ProjectQuery(*project, *account) }
}

// repeated collects a repeatable flag's values as given.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, " ") }
func (r *repeated) Set(s string) error { *r = append(*r, s); return nil }

// secretKV collects --secret KEY=VALUE. A malformed one is reported after
// parsing, without its text: the flag package would repeat it.
type secretKV struct {
	m   map[string]string
	bad bool
}

func (s *secretKV) String() string { return "" }
func (s *secretKV) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		s.bad = true
		return nil
	}
	s.m[k] = val
	return nil
}

// optBool is a boolean flag that may be absent: --x, --x=true, --x=false.
type optBool struct{ v *bool }

func (o *optBool) String() string {
	if o == nil || o.v == nil {
		return ""
	}
	return strconv.FormatBool(*o.v)
}
func (o *optBool) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return fmt.Errorf("want true or false")
	}
	o.v = &b
	return nil
}
func (o *optBool) IsBoolFlag() bool { return true }

// varFlags are the variable flags of create and set.
type varFlags struct {
	vars    kv
	secrets secretKV
	fromEnv list
}

func addVarFlags(fs *flag.FlagSet) *varFlags {
	v := &varFlags{vars: kv{}, secrets: secretKV{m: map[string]string{}}}
	fs.Var(v.vars, "var", "a plain variable KEY=VALUE (repeatable)")
	fs.Var(&v.secrets, "secret", "a secret variable KEY=VALUE (repeatable); the value is then on the command line (ps, shell history): prefer --secret-from-env")
	fs.Var(&v.fromEnv, "secret-from-env", "a secret variable KEY whose value is this command's own environment variable KEY (repeatable, or KEY,KEY)")
	return v
}

// collect returns the variables, secrets sealed; a KEY given twice is a
// usage error.
func (v *varFlags) collect() (map[string]apiclient.EnvVar, error) {
	if v.secrets.bad {
		return nil, usageError{"--secret: want KEY=VALUE (the value given is not repeated here)"}
	}
	out := map[string]apiclient.EnvVar{}
	add := func(k string, x apiclient.EnvVar) error {
		if _, dup := out[k]; dup {
			return usageError{fmt.Sprintf("variable %s is given twice", k)}
		}
		out[k] = x
		return nil
	}
	for k, val := range v.vars {
		if err := add(k, apiclient.EnvVar{Value: val}); err != nil {
			return nil, err
		}
	}
	for k, val := range v.secrets.m {
		if err := add(k, apiclient.EnvVar{Value: val, Secret: true}); err != nil {
			return nil, err
		}
	}
	for _, k := range v.fromEnv {
		val, ok := os.LookupEnv(k)
		if !ok || val == "" {
			return nil, usageError{fmt.Sprintf("--secret-from-env %s: the environment variable %s is not set or empty", k, k)}
		}
		if err := add(k, apiclient.EnvVar{Value: val, Secret: true}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// fileFlags are --file and --template-file, in the order given.
type fileFlags struct{ specs []fileSpec }

type fileSpec struct {
	spec     string
	template bool
}

type fileFlag struct {
	f        *fileFlags
	template bool
}

func (f fileFlag) String() string { return "" }
func (f fileFlag) Set(s string) error {
	f.f.specs = append(f.f.specs, fileSpec{s, f.template})
	return nil
}

func addFileFlags(fs *flag.FlagSet) *fileFlags {
	f := &fileFlags{}
	fs.Var(fileFlag{f, false}, "file", "put the local file LOCAL_PATH (UTF-8 text) in the guest at GUEST_PATH, as GUEST_PATH=LOCAL_PATH (repeatable; mode 0644)")
	fs.Var(fileFlag{f, true}, "template-file", "like --file, but {{KEY}} in it is replaced by the variable KEY (a secret by the sandbox's placeholder, never its value) (repeatable)")
	return f
}

func (f *fileFlags) collect() ([]apiclient.EnvFile, error) {
	var out []apiclient.EnvFile
	for _, s := range f.specs {
		name := "--file"
		if s.template {
			name = "--template-file"
		}
		guest, local, ok := strings.Cut(s.spec, "=")
		if !ok || guest == "" || local == "" {
			return nil, usageError{fmt.Sprintf("%s %q: want GUEST_PATH=LOCAL_PATH", name, s.spec)}
		}
		b, err := os.ReadFile(local)
		if err != nil {
			return nil, usageError{fmt.Sprintf("%s: %v", name, err)}
		}
		if !utf8.Valid(b) {
			return nil, usageError{fmt.Sprintf("%s: %s is not UTF-8 text (environment files hold text)", name, local)}
		}
		out = append(out, apiclient.EnvFile{Path: guest, Content: string(b), Template: s.template})
	}
	return out, nil
}

const credentialHelp = `a credential rule (repeatable): where the secret variable SECRET may be used, as
'SECRET=HOST[,HOST...][:PORTS][;header=NAME;format=TEXT][;allow_http]'
(HOST a name or *.domain; PORTS e.g. 443 or 80,443 or 8000-9000; with header=, the host sets
that header to TEXT with {value} replaced by the secret, e.g. 'TOKEN=api.example.com:443;header=Authorization;format=Bearer {value}';
without it, the sandbox's placeholder is replaced wherever it appears in a request's headers or URL),
or the rule as JSON: '{"secret":"TOKEN","hosts":["api.example.com"],"ports":"443","header":"Authorization","format":"Bearer {value}"}'`

// parseCredential parses a --credential rule.
func parseCredential(s string) (apiclient.CredentialRule, error) {
	var r apiclient.CredentialRule
	bad := func(why string) (apiclient.CredentialRule, error) {
		return r, usageError{fmt.Sprintf("--credential %q: %s", s, why)}
	}
	if strings.HasPrefix(strings.TrimSpace(s), "{") {
		dec := json.NewDecoder(strings.NewReader(s))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&r); err != nil {
			return bad(err.Error())
		}
		return r, nil
	}
	main, opts, _ := strings.Cut(s, ";")
	secret, dest, ok := strings.Cut(main, "=")
	if !ok || strings.TrimSpace(secret) == "" || strings.TrimSpace(dest) == "" {
		return bad("want SECRET=HOST[,HOST...][:PORTS][;header=NAME;format=TEXT][;allow_http]")
	}
	hosts, ports, hasPorts := strings.Cut(dest, ":")
	r.Secret = strings.TrimSpace(secret)
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			r.Hosts = append(r.Hosts, h)
		}
	}
	if len(r.Hosts) == 0 {
		return bad("no host")
	}
	if hasPorts {
		if r.Ports = strings.TrimSpace(ports); r.Ports == "" {
			return bad("empty PORTS after ':'")
		}
	}
	for _, o := range strings.Split(opts, ";") {
		if strings.TrimSpace(o) == "" {
			continue
		}
		k, v, hasV := strings.Cut(o, "=")
		switch strings.ToLower(strings.TrimSpace(k)) {
		case "header":
			r.Header = strings.TrimSpace(v)
		case "format":
			r.Format = v
		case "allow_http":
			r.AllowHTTP = true
			if hasV {
				b, err := strconv.ParseBool(strings.TrimSpace(v))
				if err != nil {
					return bad("allow_http: want true or false")
				}
				r.AllowHTTP = b
			}
		default:
			return bad(fmt.Sprintf("unknown option %q (want header=, format= or allow_http)", strings.TrimSpace(k)))
		}
	}
	if r.Format != "" && r.Header == "" {
		return bad("format= needs header=")
	}
	return r, nil
}

func credentials(specs repeated) ([]apiclient.CredentialRule, error) {
	var out []apiclient.CredentialRule
	for _, s := range specs {
		r, err := parseCredential(s)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func envCreate(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	vars := addVarFlags(fs)
	files := addFileFlags(fs)
	var creds repeated
	fs.Var(&creds, "credential", credentialHelp)
	safe := fs.Bool("third-party-safe", false, "third-party sandboxes (harebox new --third-party) may get this environment")
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	req := apiclient.EnvironmentRequest{Name: pos[0], ThirdPartySafe: *safe}
	if req.Variables, err = vars.collect(); err != nil {
		return 0, err
	}
	if req.Files, err = files.collect(); err != nil {
		return 0, err
	}
	if req.Credentials, err = credentials(creds); err != nil {
		return 0, err
	}
	var e apiclient.Environment
	if err := c.c.Do(ctx, "POST", apiclient.Path("environments"), query(), req, &e); err != nil {
		return 0, err
	}
	return 0, c.printEnvironment(e)
}

func envSet(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	vars := addVarFlags(fs)
	var unset list
	fs.Var(&unset, "unset", "remove the variable KEY (repeatable, or KEY,KEY)")
	files := addFileFlags(fs)
	noFiles := fs.Bool("no-files", false, "remove every file (--file and --template-file otherwise replace all the files; without them the files stay)")
	var creds repeated
	fs.Var(&creds, "credential", credentialHelp+"\n(replaces all the credential rules; without it they stay)")
	noCreds := fs.Bool("no-credentials", false, "remove every credential rule")
	var safe optBool
	fs.Var(&safe, "third-party-safe", "true or false: whether third-party sandboxes may get this version (default: as the latest one)")
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	req := apiclient.EnvironmentUpdate{Unset: unset, ThirdPartySafe: safe.v}
	vs, err := vars.collect()
	if err != nil {
		return 0, err
	}
	if len(vs) > 0 {
		req.Set = vs
	}
	for _, k := range unset {
		if _, ok := vs[k]; ok {
			return 0, usageError{fmt.Sprintf("variable %s is both set and unset", k)}
		}
	}
	fl, err := files.collect()
	if err != nil {
		return 0, err
	}
	switch {
	case *noFiles && len(fl) > 0:
		return 0, usageError{"--no-files excludes --file and --template-file"}
	case *noFiles:
		fl = []apiclient.EnvFile{}
		req.Files = &fl
	case len(fl) > 0:
		req.Files = &fl
	}
	cr, err := credentials(creds)
	if err != nil {
		return 0, err
	}
	switch {
	case *noCreds && len(cr) > 0:
		return 0, usageError{"--no-credentials excludes --credential"}
	case *noCreds:
		cr = []apiclient.CredentialRule{}
		req.Credentials = &cr
	case len(cr) > 0:
		req.Credentials = &cr
	}
	if req.Set == nil && len(req.Unset) == 0 && req.Files == nil && req.Credentials == nil && req.ThirdPartySafe == nil {
		return 0, usageError{"nothing to change (give --var, --secret, --secret-from-env, --unset, --file, --credential or --third-party-safe)"}
	}
	var e apiclient.Environment
	if err := c.c.Do(ctx, "PATCH", apiclient.Path("environments", pos[0]), query(), req, &e); err != nil {
		return 0, err
	}
	return 0, c.printEnvironment(e)
}

func envGet(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	var e apiclient.Environment
	if err := c.c.Do(ctx, "GET", apiclient.Path("environments", pos[0]), query(), nil, &e); err != nil {
		return 0, err
	}
	return 0, c.printEnvironment(e)
}

func envList(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	if _, err := exactly(fs, c, args); err != nil {
		return 0, err
	}
	var out struct {
		Environments []apiclient.Environment `json:"environments"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("environments"), query(), nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, e := range out.Environments {
		rows = append(rows, []string{e.Name, strconv.Itoa(e.Latest), e.Project, when(&e.UpdatedAt)})
	}
	return 0, c.show(out, "NAME\tLATEST\tPROJECT\tUPDATED", rows)
}

func envVersions(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	var out struct {
		Versions []apiclient.EnvVersion `json:"versions"`
	}
	if err := c.c.Do(ctx, "GET", apiclient.Path("environments", pos[0], "versions"), query(), nil, &out); err != nil {
		return 0, err
	}
	var rows [][]string
	for _, v := range out.Versions {
		var names []string
		for _, k := range sortedKeys(v.Variables) {
			if v.Variables[k].Secret {
				k += "(secret)"
			}
			names = append(names, k)
		}
		rows = append(rows, []string{strconv.Itoa(v.Version), when(&v.CreatedAt), yesNo(v.ThirdPartySafe),
			dash(strings.Join(names, ",")), strconv.Itoa(len(v.Files)), strconv.Itoa(len(v.Credentials))})
	}
	return 0, c.show(out, "VERSION\tCREATED\tTHIRD-PARTY-SAFE\tVARIABLES\tFILES\tCREDENTIALS", rows)
}

func envVersion(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	pos, err := exactly(fs, c, args, "NAME", "N")
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(pos[1])
	if err != nil || n < 1 {
		return 0, usageError{fmt.Sprintf("version %q: want a number from 1", pos[1])}
	}
	var v apiclient.EnvVersion
	if err := c.c.Do(ctx, "GET", apiclient.Path("environments", pos[0], "versions", strconv.Itoa(n)), query(), nil, &v); err != nil {
		return 0, err
	}
	if c.output == "json" {
		return 0, c.json(v)
	}
	if err := c.table("VERSION\tCREATED\tTHIRD-PARTY-SAFE", [][]string{{strconv.Itoa(v.Version), when(&v.CreatedAt), yesNo(v.ThirdPartySafe)}}); err != nil {
		return 0, err
	}
	return 0, c.printEnvContent(&v)
}

func envDelete(ctx context.Context, c *cli, fs *flag.FlagSet, args []string) (int, error) {
	query := envFlags(fs)
	pos, err := exactly(fs, c, args, "NAME")
	if err != nil {
		return 0, err
	}
	if err := c.c.Do(ctx, "DELETE", apiclient.Path("environments", pos[0]), query(), nil, nil); err != nil {
		return 0, err
	}
	return 0, c.deleted("environment", pos[0])
}

// printEnvironment prints an environment; in a table, its latest version's
// variables (a secret as "(secret)"), files and credential rules follow.
func (c *cli) printEnvironment(e apiclient.Environment) error {
	if c.output == "json" {
		return c.json(e)
	}
	safe := "-"
	if e.Version != nil {
		safe = yesNo(e.Version.ThirdPartySafe)
	}
	if err := c.table("ID\tNAME\tLATEST\tPROJECT\tTHIRD-PARTY-SAFE\tUPDATED",
		[][]string{{e.ID, e.Name, strconv.Itoa(e.Latest), e.Project, safe, when(&e.UpdatedAt)}}); err != nil {
		return err
	}
	return c.printEnvContent(e.Version)
}

// printEnvContent prints a version's variables, files and credential
// rules as tables, each after a blank line.
func (c *cli) printEnvContent(v *apiclient.EnvVersion) error {
	if v == nil {
		return nil
	}
	var rows [][]string
	for _, k := range sortedKeys(v.Variables) {
		val := "(secret)"
		if x := v.Variables[k]; !x.Secret {
			val = printable(x.Value)
		}
		rows = append(rows, []string{k, val})
	}
	fmt.Fprintln(c.stdout)
	if err := c.table("VARIABLE\tVALUE", rows); err != nil {
		return err
	}
	if len(v.Files) > 0 {
		rows = nil
		for _, f := range v.Files {
			mode := "-"
			if f.Mode != 0 {
				mode = fmt.Sprintf("%04o", f.Mode)
			}
			rows = append(rows, []string{f.Path, mode, dash(f.Owner), yesNo(f.Template), strconv.Itoa(len(f.Content))})
		}
		fmt.Fprintln(c.stdout)
		if err := c.table("FILE\tMODE\tOWNER\tTEMPLATE\tBYTES", rows); err != nil {
			return err
		}
	}
	if len(v.Credentials) > 0 {
		rows = nil
		for _, r := range v.Credentials {
			rows = append(rows, []string{r.Secret, strings.Join(r.Hosts, ","), dash(r.Ports), dash(r.Header), dash(r.Format), yesNo(r.AllowHTTP)})
		}
		fmt.Fprintln(c.stdout)
		if err := c.table("CREDENTIAL\tHOSTS\tPORTS\tHEADER\tFORMAT\tALLOW-HTTP", rows); err != nil {
			return err
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// printable quotes a value that is empty or holds spaces at its ends or
// control characters, so a table stays one line per row.
func printable(s string) string {
	if s == "" || strings.TrimSpace(s) != s || strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) }) >= 0 {
		return strconv.Quote(s)
	}
	return s
}

// envFlag is harebox new's --env: KEY=VALUE is a variable of the sandbox,
// NAME[@VERSION] (no '=') an environment of the project to pin.
type envFlag struct {
	vars kv
	envs []string
}

func (e *envFlag) String() string { return "" }
func (e *envFlag) Set(s string) error {
	if strings.Contains(s, "=") {
		return e.vars.Set(s)
	}
	if strings.TrimSpace(s) == "" {
		return fmt.Errorf("want KEY=VALUE or an environment NAME[@VERSION]")
	}
	e.envs = append(e.envs, s)
	return nil
}

// environment returns the one environment given, or "".
func (e *envFlag) environment() (string, error) {
	switch len(e.envs) {
	case 0:
		return "", nil
	case 1:
		return e.envs[0], nil
	}
	return "", usageError{fmt.Sprintf("at most one environment (--env %s)", strings.Join(e.envs, " --env "))}
}
