// Command hareboxd is the HareBox REST server: a thin layer over the
// engine. Sandboxes outlive it; a restarted server re-adopts them.
//
//	hareboxd --data-dir /var/lib/harebox --listen 127.0.0.1:7070
//	hareboxd --data-dir /var/lib/harebox --listen unix:/run/harebox.sock
//	hareboxd --data-dir /var/lib/harebox --listen 0.0.0.0:7443 --tls-cert C --tls-key K
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/api"
	"github.com/harebox/harebox/audit"
	"github.com/harebox/harebox/budget"
	"github.com/harebox/harebox/clone"
	"github.com/harebox/harebox/cluster"
	"github.com/harebox/harebox/console"
	"github.com/harebox/harebox/firewall"
	"github.com/harebox/harebox/internal/docslink"
	"github.com/harebox/harebox/mesh"
	"github.com/harebox/harebox/network"
	"github.com/harebox/harebox/network/linuxnet"
	"github.com/harebox/harebox/network/wgtunnel"
	"github.com/harebox/harebox/sandbox"
	"github.com/harebox/harebox/secrets"
	"github.com/harebox/harebox/servertls"
	"github.com/harebox/harebox/store"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	args := os.Args[1:]
	switch {
	case len(args) > 0 && args[0] == "doctor":
		os.Exit(doctorCmd(args[1:], os.Stdout, os.Stderr))
	case len(args) > 0 && args[0] == "config":
		os.Exit(configCheck(args[1:], os.Stdout, os.Stderr))
	case len(args) > 0 && args[0] == "cluster-cert":
		os.Exit(clusterCert(args[1:], os.Stdout, os.Stderr))
	}
	if err := run(args, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "hareboxd:", err)
		os.Exit(1)
	}
}

// configCheck is "hareboxd config check FILE": the file's settings checked
// as a start would check them, without starting.
func configCheck(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 || args[0] != "check" {
		fmt.Fprintln(stderr, "usage: hareboxd config check FILE")
		return 2
	}
	if err := run([]string{"--config", args[1]}, func(settings) error { return nil }); err != nil {
		fmt.Fprintln(stderr, "hareboxd:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: ok\n", args[1])
	return 0
}

// settings is what doctor needs of the checked settings.
type settings struct {
	dataDir, imageDir, backend, network string
	golden                              bool
	pool                                map[string]int
	addressPool, meshPool               netip.Prefix // (--network linux)
}

// run starts the server as args (flags, and the --config file under them)
// say. Every setting is checked before anything is touched. With instead,
// run calls it with the checked settings rather than start the server.
func run(args []string, instead func(settings) error) error {
	fs := flag.NewFlagSet("hareboxd", flag.ContinueOnError)
	var (
		dataDir      = fs.String("data-dir", "/var/lib/harebox", "data directory: database, images, machines, keys")
		listen       = fs.String("listen", "127.0.0.1:7070", "address: host:port (loopback) or unix:PATH")
		backend      = fs.String("hypervisor", "qemu", "hypervisor backend plugin: qemu or cloud-hypervisor")
		pluginPath   = fs.String("plugin", "", "backend plugin binary (default harebox-plugin-<hypervisor> beside hareboxd, or on PATH)")
		meshPool     = fs.String("mesh-pool", mesh.DefaultPool.String(), "the address space of the projects' private meshes, a /22 for each project's (the same on every host; apart from --address-pool)")
		maxVolumeGB  = fs.Int("max-volume-gb", 100, "the largest volume a create or resize may ask for, in GB")
		projectVolGB = fs.Int("project-volume-gb", 1000, "a project's quota of volumes, their sizes together, in GB")
		meshEndpoint = fs.String("mesh-endpoint", "", "ADDR:PORT: this host's end of the mesh's WireGuard tunnels to the deployment's other hosts (with a PostgreSQL --store and --network linux): its address on the network between the hosts and the UDP port the tunnels arrive on (bound on all addresses); unset: each project's mesh stays within each host")
		cpuOver      = fs.Float64("cpu-overcommit", 4, "admission: the sandboxes' vCPUs together may be that many times the host's cores")
		memOver      = fs.Float64("memory-overcommit", 1, "admission: the sandboxes' memory together may be that many times the host's memory (less 1 GiB kept for the host); above 1, busy guests can make the host swap or kill VMMs (docs/performance.md)")
		maxFile      = fs.Int64("max-file-bytes", 256<<20, "the largest file a sandbox's file calls write or read, in bytes")
		guestASLR    = fs.Bool("tcg-guest-aslr", false, "qemu under software emulation (TCG): keep address-space randomization in guests, which makes every process start in them 3 to 4 times slower (off by default there; guests under KVM always keep it)")
		imageDir     = fs.String("image-dir", "", "built images (default DATA_DIR/images)")
		agentPath    = fs.String("agent", "", "the static harebox-agent binary POST /v1/images builds images with (default: beside hareboxd, or PREFIX/lib/harebox)")
		site         = fs.String("site", "local", "the site this host is in, e.g. fr-par-1")
		country      = fs.String("country", "", "the site's country code, e.g. FR")
		debug        = fs.Bool("debug", false, "log every request")
		webConsole   = fs.Bool("console", true, "serve the web console at /console/ on the API's listener (docs/console.md); --console=false serves the API alone")
		netKind      = fs.String("network", "linux", "sandbox network: linux (tap, host firewall, DNS, egress proxy) or none")
		pool         = fs.String("address-pool", "10.231.0.0/16", "where sandbox addresses come from (a /30 each)")
		upstream     = fs.String("dns-upstream", "", "DNS server (host:port) for allowed names (default: the first nameserver in /etc/resolv.conf)")
		table        = fs.String("nft-table", "harebox", "the nftables table (family inet) that holds the sandboxes' firewall")
		defaultFW    = fs.String("default-firewall", "public", "policy of sandboxes created without one: public (the public internet only), deny (nothing), or @FILE (a policy document)")
		plaintext    = fs.Bool("plaintext-disks", false, "turn crypto-erase off: sandboxes' disks and snapshots are plain files and delete only removes them (needed for a backend that cannot encrypt: cloud-hypervisor without root, qemu-img or qemu-storage-daemon)")
		prices       = fs.String("prices", "", "price table, a JSON file of decimal dollar strings per hour: vcpu_hour, memory_gib_hour, paused_vcpu_hour, paused_memory_gib_hour, disk_gb_hour, snapshot_gb_hour, and egress_gb per GB (default: docs/budgets.md's)")
		meterEvery   = fs.Duration("meter-interval", 5*time.Second, "how often sandboxes' usage is settled against their budgets (and what a reservation covers)")
		poolFlag     = fs.String("pool", "auto", "keep that many sandboxes restored from the golden snapshot idle and ready for each image and size, claimed by creates: IMAGE:PRESET=N[,IMAGE:PRESET=N...], e.g. default:small=4 (implies --golden-snapshots); auto: one of the default image at the small size per 8 small sandboxes the host admits (1 to 4; none below 4, or with --golden-snapshots=false); none: no pool. The deployment's pool, once set (harebox pool set), replaces it")
		golden       = fs.Bool("golden-snapshots", true, "restore creates from a golden snapshot of their image and size (booted once, in the background, on the first create of each) instead of booting them; --golden-snapshots=false boots every create")
		goldenShared = fs.Bool("golden-shared-memory", false, "sandboxes restored from a golden snapshot (and warm-pool members) share its memory copy-on-write (qemu): an idle one holds a small part of the memory it would, and its guest runs slower while it first writes its pages (docs/hypervisors.md)")
		goldenDir    = fs.String("golden-dir", "", "where golden snapshots are kept across restarts (default DATA_DIR/golden); servers on one machine that share it, --golden-key and --image-dir share them")
		goldenKey    = fs.String("golden-key", "", "the file of the 32-byte key that seals the golden snapshots' keys (default: the host's master key, DATA_DIR/master.key; made if missing)")
		metricsEvery = fs.Duration("metrics-interval", 15*time.Second, "how often every sandbox created with monitoring on is sampled (CPU, memory, disk, network, from the host side)")
		proxies      = fs.String("trusted-proxy", "", "comma-separated CIDRs of proxies whose X-Forwarded-For names the caller (for keys limited by address)")
		tlsCert      = fs.String("tls-cert", "", "serve HTTPS with this certificate chain (PEM; read again when it changes, and on SIGHUP)")
		tlsKey       = fs.String("tls-key", "", "the private key of --tls-cert (PEM)")
		selfSigned   = fs.Bool("tls-self-signed", false, "serve HTTPS with a self-signed certificate made on first start and kept in DATA_DIR/tls (clients trust it with HAREBOX_CA=DATA_DIR/tls/cert.pem or the fingerprint in DATA_DIR/tls/fingerprint)")
		logFormat    = fs.String("log-format", "text", "log lines on stderr: text (key=value) or json (one object per line)")
		ingressAddr  = fs.String("ingress-listen", "", "serve sandboxes' published ports (URLs) on this address, host:port, over HTTPS; empty: no ingress, and ports cannot be published")
		ingressURL   = fs.String("ingress-url", "", "the ingress's public base URL, https://HOST[:PORT]: URLs are https://PORT-ID.HOST/ and https://HOST/s/ID/PORT/ (default https://localhost:PORT; *.localhost is loopback to browsers)")
		ingressCert  = fs.String("ingress-tls-cert", "", "the ingress's certificate chain (PEM), for HOST and *.HOST; default: a self-signed one made on first start in DATA_DIR/ingress-tls")
		ingressKey   = fs.String("ingress-tls-key", "", "the private key of --ingress-tls-cert (PEM)")
		storeURL     = fs.String("store", "", "the state database: empty for SQLite in DATA_DIR/harebox.db, or a PostgreSQL URL (postgres://USER@HOST/DB?sslmode=verify-full) that several hosts may share")
		hostName     = fs.String("host-name", "", "this host's name among the hosts that share the store (default: the machine's host name)")
		hostLease    = fs.Duration("host-lease", 15*time.Second, "how long this host stays up in the store without renewing; when it lapses, the other hosts mark it down and its sandboxes lost")
		internalAddr = fs.String("internal-listen", "", "serve the other hosts of the deployment on this address, host:port (mutual TLS with --cluster-*): they forward requests for this host's sandboxes here; empty: one host")
		internalURL  = fs.String("internal-url", "", "this host's internal endpoint as the other hosts reach it, https://HOST:PORT (default https://INTERNAL_LISTEN)")
		clusterCA    = fs.String("cluster-ca", "", "the deployment CA's certificate (PEM; hareboxd cluster-cert makes it)")
		clusterCert  = fs.String("cluster-cert", "", "this host's certificate of the deployment CA (PEM)")
		clusterKey   = fs.String("cluster-key", "", "the private key of --cluster-cert (PEM)")
		auditAnchor  = fs.String("audit-anchor", "", "where each signed checkpoint of the audit log is also kept, outside the database, so that a cut tail shows: file:/ABSOLUTE/PATH (an append-only file: chattr +a it, or ship it off the host) or none (default file:DATA_DIR/audit.anchor)")
		auditEvery   = fs.Duration("audit-checkpoint-interval", audit.CheckpointInterval, "how long an audit entry waits for its signed checkpoint at most (and every 256 entries, and at shutdown): what a crash leaves unanchored")
		e2bAddr      = fs.String("e2b-listen", "", "serve E2B's API on this address, host:port: its control plane and each sandbox's envd, for the unmodified E2B SDKs (E2B_API_URL and E2B_SANDBOX_URL pointed here); plain HTTP only on loopback")
		e2bDomain    = fs.String("e2b-domain", "", "the domain E2B sandboxes are reported under, and routed by host name (PORT-SANDBOXID.DOMAIN), for E2B_DOMAIN users")
		e2bCert      = fs.String("e2b-tls-cert", "", "serve the E2B listener over HTTPS with this certificate chain (PEM; for DOMAIN and *.DOMAIN)")
		e2bKey       = fs.String("e2b-tls-key", "", "the private key of --e2b-tls-cert (PEM)")
		e2bSelf      = fs.Bool("e2b-tls-self-signed", false, "serve the E2B listener over HTTPS with a self-signed certificate for DOMAIN and *.DOMAIN, made on first start in DATA_DIR/e2b-tls")
		e2bTemplates = fs.String("e2b-templates", "", "E2B template names and the images they create: TEMPLATE=IMAGE[,TEMPLATE=IMAGE...] (default base=default,code-interpreter-v1=code-interpreter)")
		configFile   = fs.String("config", "", "a YAML file of settings: each key a flag's name, e.g. \"listen: 0.0.0.0:7443\"; flags given on the command line win")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *configFile != "" {
		if err := applyConfig(fs, *configFile); err != nil {
			return err
		}
	}
	priceTable := budget.DefaultPrices
	if *prices != "" {
		var err error
		if priceTable, err = budget.LoadPrices(*prices); err != nil {
			return fmt.Errorf("--prices: %w", err)
		}
	}
	if *meterEvery < 100*time.Millisecond {
		return fmt.Errorf("--meter-interval %v: at least 100ms", *meterEvery)
	}
	if *metricsEvery < time.Second {
		return fmt.Errorf("--metrics-interval %v: at least 1s", *metricsEvery)
	}
	meshPrefix, err := netip.ParsePrefix(*meshPool)
	if err != nil {
		return fmt.Errorf("--mesh-pool: %w", err)
	}
	var meshEP netip.AddrPort
	if *meshEndpoint != "" {
		if meshEP, err = netip.ParseAddrPort(*meshEndpoint); err != nil || meshEP.Port() == 0 || meshEP.Addr().IsUnspecified() {
			return fmt.Errorf("--mesh-endpoint %q: want this host's ADDR:PORT on the network between the hosts", *meshEndpoint)
		}
		if *storeURL == "" || *netKind != "linux" {
			return fmt.Errorf("--mesh-endpoint: tunnels between hosts need the hosts' shared --store (PostgreSQL) and --network linux")
		}
	}
	for _, o := range []struct {
		name string
		v    float64
	}{{"cpu-overcommit", *cpuOver}, {"memory-overcommit", *memOver}} {
		if !(o.v > 0 && o.v <= 64) {
			return fmt.Errorf("--%s %v: want a factor above 0, at most 64", o.name, o.v)
		}
	}
	if *maxFile < 1<<20 {
		return fmt.Errorf("--max-file-bytes %d: at least 1 MiB (1048576)", *maxFile)
	}
	var prefix netip.Prefix
	switch *netKind {
	case "linux":
		var err error
		if prefix, err = netip.ParsePrefix(*pool); err != nil {
			return fmt.Errorf("--address-pool: %w", err)
		}
	case "none":
	default:
		return fmt.Errorf("--network %q: want linux or none", *netKind)
	}
	if *logFormat != "text" && *logFormat != "json" {
		return fmt.Errorf("--log-format %q: want text or json", *logFormat)
	}
	if *backend != "qemu" && *backend != "cloud-hypervisor" {
		return fmt.Errorf("--hypervisor %q: want qemu or cloud-hypervisor", *backend)
	}
	fw, err := defaultFirewall(*defaultFW)
	if err != nil {
		return err
	}
	warm, err := parsePool(*poolFlag)
	if err != nil {
		return err
	}
	autoPool := *poolFlag == "auto"
	var trusted []netip.Prefix
	for _, c := range strings.Split(*proxies, ",") {
		if c = strings.TrimSpace(c); c == "" {
			continue
		}
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return fmt.Errorf("--trusted-proxy %q: %w", c, err)
		}
		trusted = append(trusted, p)
	}
	useTLS, err := checkTLS(*listen, *tlsCert, *tlsKey, *selfSigned)
	if err != nil {
		return err
	}
	if err := checkListen(*listen, useTLS); err != nil {
		return err
	}
	ingressBase, err := checkIngress(*ingressAddr, *ingressURL, *ingressCert, *ingressKey)
	if err != nil {
		return err
	}
	clusterTLS, advertised, err := checkCluster(*internalAddr, *internalURL, *clusterCA, *clusterCert, *clusterKey, *storeURL)
	if err != nil {
		return err
	}
	if *hostName != "" && !cluster.ValidHostName(*hostName) {
		return fmt.Errorf("--host-name %q: lower-case letters, digits, dots and dashes", *hostName)
	}
	if *hostLease < time.Second {
		return fmt.Errorf("--host-lease %v: at least 1s", *hostLease)
	}
	anchorSetting, err := checkAuditAnchor(*auditAnchor, *dataDir)
	if err != nil {
		return err
	}
	if *auditEvery < time.Second {
		return fmt.Errorf("--audit-checkpoint-interval %v: at least 1s", *auditEvery)
	}
	e2bSet, err := checkE2B(*e2bAddr, *e2bDomain, *e2bCert, *e2bKey, *e2bSelf, *e2bTemplates)
	if err != nil {
		return err
	}
	capacity := harebox.Capacity{CPUOvercommit: *cpuOver, MemoryOvercommit: *memOver}
	if autoPool && *golden {
		warm = clone.AutoPool(capacity.Limits(existing(*dataDir)))
	}
	if instead != nil {
		return instead(settings{dataDir: *dataDir, imageDir: *imageDir, backend: *backend, network: *netKind, golden: *golden, pool: warm,
			addressPool: prefix, meshPool: meshPrefix})
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	var handler slog.Handler = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	if *logFormat == "json" {
		handler = slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	}
	log := slog.New(handler)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := catchHangup(ctx, log)
	if err := os.MkdirAll(*dataDir, 0o700); err != nil {
		return err
	}
	key, keyPath, created, err := api.LoadOrCreateRootKey(*dataDir)
	if err != nil {
		return err
	}
	if created {
		log.Info("created the root API key", "path", keyPath)
	}
	var st store.Store
	var pgdb *store.DB
	switch {
	case *storeURL == "":
	case strings.HasPrefix(*storeURL, "postgres://"), strings.HasPrefix(*storeURL, "postgresql://"):
		db, err := store.OpenPostgres(ctx, *storeURL)
		if err != nil {
			return fmt.Errorf("--store: %w", err)
		}
		defer db.Close()
		st, pgdb = db, db
		log.Info("state in PostgreSQL", "host", pgHost(*storeURL))
	default:
		return fmt.Errorf("--store: want a postgres:// URL (or nothing, for SQLite in the data directory)")
	}
	// Sandboxes whose policy names api.harebox.internal reach the API
	// through the egress proxy, over in-process connections.
	pipes := api.NewPipes()
	var sandboxNet network.Network = network.None{}
	var tunnel *wgtunnel.Tunnel
	if meshEP.IsValid() {
		if tunnel, err = openTunnel(*dataDir, meshEP.Port(), log); err != nil {
			return err
		}
		defer tunnel.Close() // (after the engine's)
		log.Info("mesh tunnels to the other hosts", "endpoint", meshEP, "interface", tunnel.Name(), "public_key", tunnel.PublicKey())
	}
	switch *netKind {
	case "linux":
		lo := linuxnet.Options{
			StateDir: filepath.Join(*dataDir, "net"), Pool: prefix, Upstream: *upstream, Table: *table, Logger: log,
			API: pipes.Dial, MeshPool: meshPrefix,
		}
		if tunnel != nil {
			lo.MeshTunnel = tunnel.Name()
		}
		ln, err := linuxnet.New(ctx, lo)
		if err != nil {
			return fmt.Errorf("network: %w", err)
		}
		defer ln.Close() // the resolver and proxy stop; taps and rules stay for running VMs
		sandboxNet = ln
	case "none":
		log.Warn("sandboxes get no network (--network none)")
	}
	anchor, err := audit.ParseAnchor(anchorSetting)
	if err != nil {
		return fmt.Errorf("--audit-anchor: %w", err)
	}
	if c, ok := anchor.(io.Closer); ok {
		defer c.Close() // after the engine, which signs into it as it closes
	}
	if anchor == audit.None {
		log.Warn("audit checkpoints are kept in the database only (--audit-anchor none): a tail cut with its checkpoints does not show")
	} else {
		log.Info("audit checkpoints also kept outside the database", "anchor", anchor.String())
	}
	var pluginArgs []string
	if *guestASLR && *backend == "qemu" {
		pluginArgs = append(pluginArgs, "--tcg-guest-aslr")
	}
	opts := harebox.Options{
		DefaultFirewall: fw, PluginArgs: pluginArgs, MaxFileBytes: *maxFile, MeshPool: meshPrefix,
		DataDir: *dataDir, Backend: *backend, PluginPath: *pluginPath, ImageDir: *imageDir,
		Site: sandbox.Site{Name: *site, Country: *country}, Logger: log, Network: sandboxNet,
		PlaintextDisks: *plaintext, Prices: &priceTable, MeterInterval: *meterEvery, MetricsInterval: *metricsEvery, GoldenSnapshots: *golden, Pool: warm,
		GoldenDir: *goldenDir, GoldenKey: *goldenKey, GoldenSharedMemory: *goldenShared,
		Ingress: ingressBase, Store: st, AgentPath: agentBinary(*agentPath),
		Host:        harebox.HostOptions{Name: *hostName, Address: advertised, Lease: *hostLease, TLS: clusterTLS},
		AuditAnchor: anchor, AuditCheckpointInterval: *auditEvery, MaxVolumeGB: *maxVolumeGB, ProjectVolumeGB: *projectVolGB,
		Capacity: capacity,
	}
	if tunnel != nil {
		opts.MeshTunnel, opts.MeshEndpoint = tunnel, meshEP
	}
	if autoPool && len(warm) > 0 {
		log.Info("a warm pool kept by default, sized to the host (--pool none keeps none)", "pool", warm)
	}
	eng, err := harebox.New(ctx, opts)
	if err != nil {
		return err
	}
	defer eng.Close()        // sandboxes keep running
	var lost <-chan struct{} // never, but when another process took this host's name
	if pgdb != nil {
		lost = pgdb.Lost()
	}
	srv, err := api.New(api.Options{Engine: eng, Auth: key, Version: version, Logger: log, TrustedProxies: trusted, Cluster: clusterTLS,
		NoConsole: !*webConsole})
	if err != nil {
		return err
	}
	var certs *servertls.Source
	if useTLS {
		if certs, err = serverTLS(ctx, *listen, *tlsCert, *tlsKey, *selfSigned, *dataDir, log); err != nil {
			return err
		}
		hup.certs.Store(certs)
	}
	l, err := listener(*listen, useTLS)
	if err != nil {
		return err
	}
	hs := srv.HTTPServer()
	// (The in-process connections from sandboxes stay plain HTTP: they
	// never leave the host.)
	plain := srv.HTTPServer()
	errc := make(chan error, 5)
	if ingressBase != nil {
		il, tc, err := ingressListener(ctx, *ingressAddr, ingressBase, *ingressCert, *ingressKey, *dataDir, log)
		if err != nil {
			return err
		}
		if clusterTLS != nil {
			// A URL of another host's sandbox is served by that host's
			// ingress, over the internal endpoint.
			eng.URLs().SetHosts(cluster.NewIngressHosts(eng.Cluster(), clusterTLS))
		}
		go func() { errc <- eng.URLs().Serve(ctx, il, tc) }()
		log.Info("ingress listening", "addr", *ingressAddr, "url", ingressBase.String())
	}
	var e2bSrv *http.Server
	if e2bSet != nil {
		if e2bSrv, err = serveE2B(ctx, e2bSet, eng, sandboxNet, key, *dataDir, log, errc); err != nil {
			return err
		}
	}
	scheme := "http"
	if certs != nil {
		scheme = "https"
		hs.TLSConfig = servertls.Config(certs)
		go func() { errc <- hs.ServeTLS(l, "", "") }()
	} else {
		go func() { errc <- hs.Serve(l) }()
	}
	go func() { errc <- plain.Serve(pipes) }()
	var internal *http.Server
	if clusterTLS != nil {
		il, err := net.Listen("tcp", *internalAddr)
		if err != nil {
			return fmt.Errorf("--internal-listen: %w", err)
		}
		internal = srv.HTTPServer()
		var ingress http.Handler // (what other hosts' ingresses send here)
		if ingressBase != nil {
			ingress = eng.URLs()
		}
		internal.Handler = srv.Internal(ingress)
		// (What a host forwards carries its client's headers, up to the
		// public listeners' bound, and a client certificate chain.)
		internal.MaxHeaderBytes = 2 * api.MaxHeaderBytes
		go func() { errc <- internal.Serve(tls.NewListener(il, clusterTLS.Server)) }()
		log.Info("internal endpoint listening", "addr", *internalAddr, "url", advertised, "host", eng.Cluster().Name())
	}
	log.Info("hareboxd listening", "addr", *listen, "scheme", scheme, "version", version, "root_key", keyPath)
	if *webConsole {
		log.Info("web console", "url", scheme+"://"+*listen+console.Path)
	}
	// Under systemd (Type=notify): ready now, not when the process began.
	if _, err := daemon.SdNotify(false, daemon.SdNotifyReady); err != nil {
		log.Warn("cannot tell systemd that the server is ready", "err", err)
	}
	select {
	case err := <-errc:
		return err
	case <-lost:
		return errors.New("another hareboxd took this host's name in the PostgreSQL database (this one's connection to it was lost): stopping, so that one engine runs this host's sandboxes")
	case <-ctx.Done():
	}
	daemon.SdNotify(false, daemon.SdNotifyStopping)
	log.Info("shutting down; sandboxes keep running")
	eng.Stopping() // (a drain stops after the move it is making: the shutdown waits for that one)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Both drain at once, within the same 30 s.
	plainDone := make(chan struct{})
	go func() {
		plain.Shutdown(sctx)
		if internal != nil {
			internal.Shutdown(sctx)
		}
		if e2bSrv != nil {
			e2bSrv.Shutdown(sctx)
		}
		close(plainDone)
	}()
	err = hs.Shutdown(sctx)
	<-plainDone
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// checkCluster checks the flags of the internal endpoint and returns its
// TLS and the address the other hosts reach it at (nil, "": none).
// openTunnel opens this host's end of the mesh's tunnels, its private key
// sealed under the host's master key in the data directory.
func openTunnel(dataDir string, port uint16, log *slog.Logger) (*wgtunnel.Tunnel, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	seal, err := secrets.MasterKey(filepath.Join(dataDir, "master.key"))
	if err != nil {
		return nil, err
	}
	t, err := wgtunnel.Open(wgtunnel.Options{Port: port, KeyFile: filepath.Join(dataDir, "mesh-tunnel.key"), Seal: seal, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("--mesh-endpoint: %w", err)
	}
	return t, nil
}

func checkCluster(addr, advertised, caFile, certFile, keyFile, storeURL string) (*cluster.TLS, string, error) {
	if addr == "" {
		if advertised != "" || caFile != "" || certFile != "" || keyFile != "" {
			return nil, "", errors.New("--internal-url and --cluster-*: give --internal-listen too")
		}
		return nil, "", nil
	}
	if storeURL == "" {
		return nil, "", errors.New("--internal-listen: hosts share state through a PostgreSQL --store")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, "", fmt.Errorf("--internal-listen %q: want host:port", addr)
	}
	if caFile == "" || certFile == "" || keyFile == "" {
		return nil, "", errors.New("--internal-listen needs --cluster-ca, --cluster-cert and --cluster-key (hareboxd cluster-cert makes them)")
	}
	t, err := cluster.LoadTLS(caFile, certFile, keyFile)
	if err != nil {
		return nil, "", err
	}
	if advertised == "" {
		advertised = "https://" + addr
	}
	u, err := url.Parse(advertised)
	if err != nil || u.Scheme != "https" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return nil, "", fmt.Errorf("--internal-url %q: want https://HOST:PORT", advertised)
	}
	return t, "https://" + u.Host, nil
}

// clusterCert is "hareboxd cluster-cert": the deployment CA (made in DIR
// the first time) signs a host's certificate.
func clusterCert(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hareboxd cluster-cert", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("dir", "", "where the deployment CA is (made there the first time: ca.pem, ca.key) and the host's files go (NAME.pem, NAME.key)")
	host := fs.String("host", "", "the host's name (its --host-name)")
	addrs := fs.String("addr", "", "comma-separated IPs or DNS names the other hosts reach it at")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *host == "" || *addrs == "" {
		fmt.Fprintln(stderr, "usage: hareboxd cluster-cert --dir DIR --host NAME --addr IP[,IP...]")
		return 2
	}
	made, err := cluster.MakeCA(*dir)
	if err == nil && made {
		fmt.Fprintf(stdout, "made the deployment CA: %s (keep ca.key off the hosts)\n", filepath.Join(*dir, "ca.pem"))
	}
	if err == nil {
		err = cluster.IssueHost(*dir, *host, strings.Split(*addrs, ","))
	}
	if err != nil {
		fmt.Fprintln(stderr, "hareboxd:", err)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n%s\n", filepath.Join(*dir, *host+".pem"), filepath.Join(*dir, *host+".key"))
	return 0
}

// checkIngress checks the ingress flags and returns its public base URL
// (nil: no ingress).
func checkIngress(addr, base, certFile, keyFile string) (*url.URL, error) {
	if addr == "" {
		if base != "" || certFile != "" || keyFile != "" {
			return nil, errors.New("--ingress-url and --ingress-tls-*: give --ingress-listen too")
		}
		return nil, nil
	}
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("--ingress-listen %q: want host:port", addr)
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New("--ingress-tls-cert and --ingress-tls-key go together")
	}
	if base == "" {
		base = "https://localhost:" + port
	}
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("--ingress-url %q: want https://HOST[:PORT]", base)
	}
	u.Path = ""
	u.Host = strings.ToLower(u.Host) // host names are compared without case
	return u, nil
}

// ingressListener listens for the ingress, with its certificate (from
// files, watched, or self-signed for the base's host and its subdomains).
func ingressListener(ctx context.Context, addr string, base *url.URL, certFile, keyFile, dataDir string, log *slog.Logger) (net.Listener, *tls.Config, error) {
	if certFile == "" {
		hosts := []string{base.Hostname()}
		if net.ParseIP(hosts[0]) == nil {
			hosts = append(hosts, "*."+hosts[0])
		}
		var err error
		var created bool
		certFile, keyFile, created, err = servertls.SelfSigned(filepath.Join(dataDir, "ingress-tls"), hosts)
		if err != nil {
			return nil, nil, fmt.Errorf("ingress: %w", err)
		}
		if created {
			log.Info("made a self-signed certificate for the ingress", "file", certFile)
		}
	}
	src, err := servertls.Load(certFile, keyFile, log)
	if err != nil {
		return nil, nil, fmt.Errorf("ingress: %w", err)
	}
	go src.Watch(ctx, 2*time.Second)
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--ingress-listen: %w", err)
	}
	return l, servertls.Config(src), nil
}

// checkTLS checks the TLS flags and says whether they ask for TLS.
func checkTLS(listen, certFile, keyFile string, selfSigned bool) (bool, error) {
	switch {
	case selfSigned && (certFile != "" || keyFile != ""):
		return false, errors.New("--tls-self-signed and --tls-cert/--tls-key: choose one")
	case (certFile == "") != (keyFile == ""):
		return false, errors.New("--tls-cert and --tls-key go together")
	case certFile == "" && !selfSigned:
		return false, nil
	case strings.HasPrefix(listen, "unix:"):
		return false, fmt.Errorf("--listen %s: TLS is for a TCP address (a Unix socket is reached on this host only)", listen)
	}
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Stat(f); f != "" && err != nil {
			return false, fmt.Errorf("--tls-cert/--tls-key: %w", err)
		}
	}
	return true, nil
}

// serverTLS sets up the listener's certificate: from --tls-cert and
// --tls-key (watched for changes, and read again on SIGHUP), or made once
// with --tls-self-signed.
func serverTLS(ctx context.Context, listen, certFile, keyFile string, selfSigned bool, dataDir string, log *slog.Logger) (*servertls.Source, error) {
	if selfSigned {
		host, _, _ := net.SplitHostPort(listen)
		var created bool
		var err error
		certFile, keyFile, created, err = servertls.SelfSigned(filepath.Join(dataDir, "tls"), []string{host})
		if err != nil {
			return nil, fmt.Errorf("--tls-self-signed: %w", err)
		}
		if created {
			log.Info("made a self-signed TLS certificate", "file", certFile)
		}
	}
	src, err := servertls.Load(certFile, keyFile, log)
	if err != nil {
		return nil, err
	}
	if selfSigned {
		// What a client pins (HAREBOX_CA=sha256:...), said at every start.
		log.Info("TLS certificate fingerprint", "fingerprint", servertls.Fingerprint(src.Leaf().Raw), "ca_file", certFile)
	} else {
		go src.Watch(ctx, 2*time.Second)
	}
	return src, nil
}

// onHangup handles SIGHUP (systemctl reload) for the server's life: the
// TLS certificate files are read again, if there are any. Caught from the
// start, so that a reload never ends the server (Go's default for SIGHUP).
type onHangup struct {
	ch    chan os.Signal
	certs atomic.Pointer[servertls.Source]
}

func catchHangup(ctx context.Context, log *slog.Logger) *onHangup {
	h := &onHangup{ch: make(chan os.Signal, 1)}
	signal.Notify(h.ch, syscall.SIGHUP)
	go func() {
		defer signal.Stop(h.ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-h.ch:
			}
			src := h.certs.Load()
			if src == nil {
				log.Info("SIGHUP: nothing to reload (no TLS certificate files)")
				continue
			}
			if err := src.Reload(); err != nil {
				log.Warn("SIGHUP: TLS certificate not reloaded; the previous one stays", "err", err)
			}
		}
	}()
	return h
}

// defaultFirewall reads --default-firewall.
func defaultFirewall(v string) (*firewall.Policy, error) {
	switch {
	case v == "public":
		return firewall.Default(), nil
	case v == "deny":
		return firewall.DenyAll(), nil
	case strings.HasPrefix(v, "@"):
		b, err := os.ReadFile(v[1:])
		if err != nil {
			return nil, fmt.Errorf("--default-firewall: %w", err)
		}
		p, err := firewall.Parse(b)
		if err != nil {
			return nil, fmt.Errorf("--default-firewall %s: %w", v[1:], err)
		}
		return p, nil
	}
	return nil, fmt.Errorf("--default-firewall %q: want public, deny or @FILE", v)
}

// listener opens a Unix socket (mode 0600) or a TCP address: loopback for
// plain HTTP, any with TLS. The API holds the keys to every sandbox: it is
// not offered in clear text beyond this host.
func listener(addr string, tls bool) (net.Listener, error) {
	if err := checkListen(addr, tls); err != nil {
		return nil, err
	}
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		os.Remove(path)
		l, err := net.Listen("unix", path)
		if err != nil {
			return nil, err
		}
		return l, os.Chmod(path, 0o600)
	}
	return net.Listen("tcp", addr)
}

// checkListen checks --listen: plain HTTP on loopback or a Unix socket
// only.
func checkListen(addr string, tls bool) error {
	if strings.HasPrefix(addr, "unix:") {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); !tls && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--listen %q: plain HTTP only on loopback or unix:PATH; for other addresses give --tls-cert and --tls-key, or --tls-self-signed%s", addr, docslink.See(docslink.TLS))
	}
	return nil
}

// parsePool reads --pool: IMAGE:PRESET=N[,IMAGE:PRESET=N...], or none
// (also empty); auto, which depends on the host, is nil here.
func parsePool(s string) (map[string]int, error) {
	if s == "" || s == "none" || s == "auto" {
		return nil, nil
	}
	out := map[string]int{}
	for _, part := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		n, err := strconv.Atoi(v)
		if !ok || err != nil {
			return nil, fmt.Errorf("--pool %q: want IMAGE:PRESET=N[,IMAGE:PRESET=N...]", part)
		}
		out[k] = n
	}
	return out, nil
}

// existing is dir, or its nearest parent that exists (the data
// directory is made later: its filesystem's size counts now).
func existing(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || filepath.Dir(dir) == dir {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

// pgHost is a PostgreSQL URL's host, for the log (never its password).
func pgHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "?"
	}
	return u.Host
}

// agentBinary is --agent, or the harebox-agent where make build (beside
// this binary) or make install (PREFIX/lib/harebox) puts it, or none.
func agentBinary(flag string) string {
	if flag != "" {
		return flag
	}
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	dir := filepath.Dir(self)
	for _, p := range []string{filepath.Join(dir, "harebox-agent"), filepath.Join(dir, "..", "lib", "harebox", "harebox-agent")} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	return ""
}

// checkAuditAnchor checks --audit-anchor, and says what it is once the
// default is filled in (a file in the data directory).
func checkAuditAnchor(v, dataDir string) (string, error) {
	if v == "" {
		dir, err := filepath.Abs(dataDir)
		if err != nil {
			return "", fmt.Errorf("--data-dir: %w", err)
		}
		return "file:" + filepath.Join(dir, "audit.anchor"), nil
	}
	if path, ok := strings.CutPrefix(v, "file:"); v != "none" && (!ok || !filepath.IsAbs(path) || strings.HasSuffix(path, "/")) {
		return "", fmt.Errorf("--audit-anchor %q: want file:/ABSOLUTE/PATH or none", v)
	}
	return v, nil
}
