// Package testserver starts hareboxd for end-to-end tests (the binaries
// and images built into the test cache, the host firewall in a table and
// address pool of the test's own), drives it with the CLI and the REST API,
// and checks that it left nothing behind: the e2e packages share it.
package testserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/harebox/harebox/apiclient"
	"github.com/harebox/harebox/internal/inns"
	"github.com/harebox/harebox/internal/procs"
	"github.com/harebox/harebox/internal/testimage"
)

// Server is a running hareboxd.
type Server struct {
	Cmd      *exec.Cmd
	URL, Key string
	DataDir  string
	Log      *bytes.Buffer
	// CA is what clients trust an https server with (HAREBOX_CA), and
	// HTTP a Go client that does.
	CA   string
	HTTP *http.Client
	// Table and Pool are the firewall table and the address pool's first
	// three octets ("10.239.N.") of a server Start started.
	Table, Pool string
}

type Setup struct {
	Root, Bin, ImageDir, Plugin, Hareboxd string
	// Flags come first on every server's command line (its args can
	// override them).
	Flags []string
}

func Prepare(t testing.TB) Setup {
	t.Helper()
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Skip("qemu-system-x86_64 is not installed (make deps installs it)")
	}
	if os.Getenv("HAREBOX_TEST_DEFAULT_IMAGE") != "1" {
		t.Skip("the walkthrough needs the Debian image: set HAREBOX_TEST_DEFAULT_IMAGE=1 (make test does)")
	}
	// The servers of a test run (make test sets HAREBOX_TEST_GOLDEN_DIR)
	// share their golden snapshots: each image and size boots once for
	// all of them, and their creates restore from it. Without it, only
	// the tests that ask for golden snapshots get them: a golden boot in
	// the background of every test would share the 2 cores with it.
	// No warm pool either, unless a test asks for one (hareboxd keeps one
	// by default: idle guests in every test server would share the cores
	// with the tests).
	s := Setup{Root: testimage.Root(t), Flags: []string{"--golden-snapshots=false", "--pool", "none"}}
	if d := os.Getenv("HAREBOX_TEST_GOLDEN_DIR"); d != "" {
		s.Flags = []string{"--golden-dir", d, "--golden-key", filepath.Join(d, "golden.key"), "--pool", "none"}
	}
	for _, name := range []string{"harebox", "hareboxd", "harebox-plugin-qemu"} {
		s.Bin = filepath.Dir(testimage.Binary(t, name))
	}
	s.Plugin = filepath.Join(s.Bin, "harebox-plugin-qemu")
	s.Hareboxd = filepath.Join(s.Bin, "hareboxd")
	img := testimage.Image(t, "default")
	testimage.Image(t, "minimal")
	s.ImageDir = filepath.Dir(img.Dir)
	return s
}

func Start(t testing.TB, s Setup, dataDir string, extra ...string) *Server {
	t.Helper()
	return StartEnv(t, s, dataDir, nil, extra...)
}

// StartEnv is Start with env added to hareboxd's environment (and only
// its: this process's stays as it is).
func StartEnv(t testing.TB, s Setup, dataDir string, env []string, extra ...string) *Server {
	t.Helper()
	table, pool, meshPool := networkOf(t, dataDir)
	srv := LaunchEnv(t, s, dataDir, env, append([]string{"--image-dir", s.ImageDir, "--plugin", s.Plugin, "--site", "fr-par-1", "--country", "FR",
		// The host firewall is on, in a table and pools of this data
		// directory's own (a restart on it keeps them).
		"--network", "linux", "--nft-table", table, "--address-pool", pool + "0/24", "--mesh-pool", meshPool}, extra...)...)
	srv.Table, srv.Pool = table, pool
	return srv
}

// networks holds the network number N of each data directory, claimed
// across processes (the e2e packages run at the same time) by a lock on
// a file per number, held until this process exits (however it exits).
var networks struct {
	sync.Mutex
	of    map[string]int
	locks []*os.File
}

// networkOf is the nftables table, the address pool's first three
// octets ("10.239.N.") and the mesh pool (a /21 of 100.64.0.0/10, two
// projects' ranges) of the servers on dataDir: the same for every server
// on it, and no other live test process's.
func networkOf(t testing.TB, dataDir string) (table, pool, meshPool string) {
	t.Helper()
	networks.Lock()
	defer networks.Unlock()
	if networks.of == nil {
		networks.of = map[string]int{}
	}
	n, ok := networks.of[dataDir]
	if !ok {
		n = claimNetwork(t)
		networks.of[dataDir] = n
	}
	return fmt.Sprintf("harebox_e2e_%d", n), fmt.Sprintf("10.239.%d.", n), fmt.Sprintf("100.%d.%d.0/21", 64+n/32, n%32*8)
}

// claimNetwork locks the first free network number.
func claimNetwork(t testing.TB) int {
	n, f := claimLock(t, "harebox-e2e-networks", 256)
	if f == nil {
		t.Fatal("all 256 test networks (10.239.0-255.0/24) are taken")
	}
	networks.locks = append(networks.locks, f)
	return n
}

// claimLock locks the first free number below count among the files of
// directory name in the temporary directory, across processes, and
// returns it with its locked file (held until this process exits,
// however it exits); nil if every number is held. A lock this process
// holds on another open file of the same number refuses it too.
func claimLock(t testing.TB, name string, count int) (int, *os.File) {
	dir := filepath.Join(os.TempDir(), name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for n := range count {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(n)), os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		return n, f
	}
	return 0, nil
}

// Finish stops a server that Start started, checks that it left no VM
// or machine directory, and removes the test's firewall table (which
// outlives hareboxd on purpose: running VMs keep their rules).
func Finish(t testing.TB, srv *Server, dataDir string) {
	srv.Stop(t)
	NoLeftovers(t, dataDir)
	srv.DropTable(t)
}

// FreeAddr is a loopback address for a server to listen on: a free port
// below the kernel's ephemeral range (32768 up, ip_local_port_range), so
// that no connection's own port takes it between this check and the
// server's bind, and in a block of ports this process holds (another
// test process, checking while this one's server starts, would find the
// port free too, and its server would lose the bind).
func FreeAddr(t testing.TB) string {
	t.Helper()
	ports.Lock()
	defer ports.Unlock()
	if ports.given == nil {
		ports.given = map[int]bool{}
	}
	for tries := 0; ; tries++ {
		if len(ports.blocks) == 0 || tries >= 4*portBlock {
			claimPortBlock(t)
			tries = 0
		}
		b := ports.blocks[mathrand.IntN(len(ports.blocks))]
		port := 20000 + b*portBlock + mathrand.IntN(portBlock)
		if ports.given[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			ports.given[port] = true
			return addr
		}
	}
}

// portBlock is how many ports a block holds: 48 blocks from 20000 to
// 32000.
const portBlock = 250

// ports are the blocks of ports this process holds, by a lock on a file
// per block held until it exits (as networks' numbers are), and the
// ports FreeAddr gave (each once).
var ports struct {
	sync.Mutex
	blocks []int
	locks  []*os.File
	given  map[int]bool
}

// claimPortBlock locks another free block of ports for this process.
func claimPortBlock(t testing.TB) {
	b, f := claimLock(t, "harebox-e2e-ports", 12000/portBlock)
	if f == nil {
		t.Fatal("every block of test ports (20000 to 32000) is held")
	}
	ports.blocks, ports.locks = append(ports.blocks, b), append(ports.locks, f)
}

// DropTable removes the firewall table of a server that Start started,
// and any tap left with an address of its pool (a test that failed after
// killing its server leaves its VMs' taps).
func (srv *Server) DropTable(t testing.TB) {
	if srv.Table == "" {
		return
	}
	if out, err := exec.Command("nft", "delete", "table", "inet", srv.Table).CombinedOutput(); err != nil {
		t.Logf("nft delete table: %v %s", err, out)
	}
	out, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 4 && strings.HasPrefix(f[1], "hb") && strings.HasPrefix(f[3], srv.Pool) {
			t.Logf("removing a tap left in the server's pool: %s", f[1])
			exec.Command("ip", "link", "del", f[1]).Run()
		}
	}
}

// Launch starts hareboxd on dataDir and a free loopback port with args,
// and waits until it answers.
func Launch(t testing.TB, s Setup, dataDir string, args ...string) *Server {
	t.Helper()
	return LaunchEnv(t, s, dataDir, nil, args...)
}

func LaunchEnv(t testing.TB, s Setup, dataDir string, env []string, args ...string) *Server {
	t.Helper()
	return launch(t, s, dataDir, env, "", args...)
}

// StartIn is Start for a server in network namespace ns (ip netns exec),
// whose taps, firewall table and routes are the namespace's: it listens
// on the namespace's loopback, which this process reaches through a
// forwarder on its own (Server.URL), so its API's traffic crosses no
// link. Deleting the namespace removes what the server made in it.
func StartIn(t testing.TB, s Setup, dataDir, ns string, extra ...string) *Server {
	t.Helper()
	_, pool, meshPool := networkOf(t, dataDir)
	return launch(t, s, dataDir, nil, ns, append([]string{"--image-dir", s.ImageDir, "--plugin", s.Plugin, "--site", "fr-par-1", "--country", "FR",
		"--network", "linux", "--address-pool", pool + "0/24", "--mesh-pool", meshPool}, extra...)...)
}

// nsListen is where a server in a namespace listens, on its loopback.
const nsListen = "127.0.0.1:7070"

// forwardTo forwards connections to a free loopback address here to
// nsListen in namespace ns, until the test ends; it returns the address.
func forwardTo(t testing.TB, ns string) string {
	t.Helper()
	addr := FreeAddr(t)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := DialIn(ns, "tcp", nsListen)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { io.Copy(up, c); up.(*net.TCPConn).CloseWrite() }()
				io.Copy(c, up)
			}()
		}
	}()
	return addr
}

// DialIn dials addr from network namespace ns. (The thread that entered
// the namespace is dropped after: its goroutine ends locked to it.)
func DialIn(ns, network, addr string) (c net.Conn, err error) {
	if nerr := inns.Run(ns, func() { c, err = net.DialTimeout(network, addr, 10*time.Second) }); nerr != nil {
		return nil, nerr
	}
	return c, err
}

func launch(t testing.TB, s Setup, dataDir string, env []string, ns string, args ...string) *Server {
	t.Helper()
	// (In go test -json's output: a server's VMs name their data
	// directory, so what they cost can be told by test.)
	t.Logf("hareboxd on %s", dataDir)
	addr := FreeAddr(t)
	listen := addr
	if ns != "" {
		addr, listen = forwardTo(t, ns), nsListen
	}
	srv := &Server{URL: "http://" + addr, DataDir: dataDir, Log: &bytes.Buffer{}, HTTP: &http.Client{}}
	for i, a := range args {
		// An https server: clients trust its certificate as the CA.
		switch {
		case a == "--tls-self-signed":
			srv.CA = filepath.Join(dataDir, "tls", "cert.pem")
		case a == "--tls-cert" && i+1 < len(args):
			srv.CA = args[i+1]
		}
	}
	srv.Cmd = exec.Command(s.Hareboxd, slices.Concat([]string{"--data-dir", dataDir, "--listen", listen}, s.Flags, args)...)
	if ns != "" {
		srv.Cmd = exec.Command("ip", slices.Concat([]string{"netns", "exec", ns}, srv.Cmd.Args)...)
	}
	if env != nil {
		srv.Cmd.Env = append(os.Environ(), env...)
	}
	srv.Cmd.Stdout, srv.Cmd.Stderr = srv.Log, srv.Log
	if err := srv.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A failed test ends with what the server said (a guest's console
	// is in it where a boot failed or a VM exited).
	t.Cleanup(func() {
		if t.Failed() {
			log := srv.Log.String()
			t.Logf("hareboxd on %s, the end of its log:\n%s", dataDir, log[max(0, len(log)-16<<10):])
		}
	})
	// (A loaded 2-core host, every test package at once, has taken
	// half a minute to start it.)
	started := time.Now()
	deadline := started.Add(60 * time.Second)
	for {
		if srv.CA != "" && srv.HTTP.Transport == nil {
			// (The self-signed certificate exists once the server made it.)
			if cfg, err := apiclient.TLSConfig(srv.CA); err == nil {
				srv.URL = "https://" + addr
				srv.HTTP.Transport = &http.Transport{TLSClientConfig: cfg, ForceAttemptHTTP2: true}
			}
		}
		resp, err := srv.HTTP.Get(srv.URL + "/health")
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			srv.Cmd.Process.Kill()
			srv.Cmd.Wait()
			t.Fatalf("hareboxd did not answer within %v of its start (%s): %s", time.Since(started).Round(time.Millisecond), started.Format(time.RFC3339Nano), srv.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
	key, err := os.ReadFile(filepath.Join(dataDir, "root.key"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Key = strings.TrimSpace(string(key))
	return srv
}

// Stop sends SIGTERM and waits: a graceful shutdown.
func (srv *Server) Stop(t testing.TB) {
	srv.Cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- srv.Cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("hareboxd exited with %v:\n%s", err, srv.Log)
		}
	case <-time.After(60 * time.Second):
		srv.Cmd.Process.Kill()
		t.Errorf("hareboxd did not stop within 60 s")
	}
}

func (srv *Server) Env(s Setup) []string {
	env := append(os.Environ(), "HAREBOX_URL="+srv.URL, "HAREBOX_API_KEY="+srv.Key,
		"PATH="+s.Bin+":"+os.Getenv("PATH"))
	if srv.CA != "" {
		env = append(env, "HAREBOX_CA="+srv.CA)
	}
	return env
}

// Run runs a command with the server's environment and returns its output.
func Run(t testing.TB, srv *Server, s Setup, dir string, timeout time.Duration, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	// exec resolves names with this process's PATH: use ours explicitly.
	if p := filepath.Join(s.Bin, name); FileExists(p) {
		name = p
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, srv.Env(s)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s\nserver log:\n%s", name, strings.Join(args, " "), err, out, Tail(srv.Log.String()))
	}
	return string(out)
}

func Tail(s string) string {
	if len(s) > 3000 {
		return s[len(s)-3000:]
	}
	return s
}

func (srv *Server) Sandboxes(t testing.TB, state string) []map[string]any {
	t.Helper()
	req, _ := http.NewRequest("GET", srv.URL+"/v1/sandboxes?state="+state, nil)
	req.Header.Set("Authorization", "Bearer "+srv.Key)
	resp, err := srv.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Sandboxes []map[string]any `json:"sandboxes"`
	}
	json.NewDecoder(resp.Body).Decode(&out)
	return out.Sandboxes
}

// NoLeftovers fails if the server's data dir still has machines or VMs.
func NoLeftovers(t testing.TB, dataDir string) {
	t.Helper()
	if ents, _ := os.ReadDir(filepath.Join(dataDir, "m")); len(ents) != 0 {
		t.Errorf("machine directories left: %v", ents)
	}
	for _, p := range procs.Naming(dataDir + "/") {
		if p.IsVMM() {
			syscall.Kill(p.PID, syscall.SIGKILL)
			t.Errorf("VM left running: %s", p)
		}
	}
}

// NPMInstalled installs the npm package in dir's dependencies (npm ci)
// unless its node_modules is there already.
func NPMInstalled(t testing.TB, srv *Server, s Setup, dir string) {
	t.Helper()
	if !FileExists(filepath.Join(dir, "node_modules")) {
		Run(t, srv, s, dir, 5*time.Minute, "npm", "ci", "--no-audit", "--no-fund", "--loglevel=error")
	}
}

func FileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func LastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}
