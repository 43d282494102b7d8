package cloudhypervisor

// The stub VMM: the one fake in these tests. It serves the Cloud Hypervisor
// REST API on a Unix socket, only the operations the v53 OpenAPI document
// defines, validates every request against that document with kin-openapi
// and every response it sends as well. It keeps the VM state machine the
// spec describes (404 before vm.create, 405 in the wrong state), writes
// snapshot files like the VMM does, and serves hybrid vsock on the VM's
// vsock socket with an echoing "agent" on hypervisor.AgentPort.
//
// Tests use it in-process (client tests) or as a helper process: the test
// binary re-executed with HAREBOX_CH_STUB=1 stands in for the
// cloud-hypervisor binary, so the launcher, pidfd handling and Attach run
// for real.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/harebox/harebox/agent/agentpb"
	"github.com/harebox/harebox/agent/guest"
	"github.com/harebox/harebox/agent/layout"
	"github.com/harebox/harebox/hypervisor"
)

const (
	specFile = "testdata/cloud-hypervisor-v53.0.openapi.yaml"

	stubEnv        = "HAREBOX_CH_STUB"          // "1": run as the stub VMM
	stubVersionEnv = "HAREBOX_CH_STUB_VERSION"  // what --version reports
	stubFailEnv    = "HAREBOX_CH_STUB_FAIL"     // "1": exit at once
	stubStubborn   = "HAREBOX_CH_STUB_STUBBORN" // "1": ignore vmm.shutdown
	stubSpecEnv    = "HAREBOX_CH_STUB_SPEC"     // absolute path of the spec
	stubAgentEnv   = "HAREBOX_CH_STUB_AGENT"    // "1": the vsock port serves an agent

	stubHostPort = 1073741824 // the "OK <port>" a hybrid vsock peer reports
)

var (
	specOnce   sync.Once
	specDoc    *openapi3.T
	specRouter routers.Router
	specErr    error
)

// loadSpec loads and validates the OpenAPI document once.
func loadSpec() (*openapi3.T, routers.Router, error) {
	specOnce.Do(func() {
		loader := openapi3.NewLoader()
		path := specFile
		if p := os.Getenv(stubSpecEnv); p != "" {
			path = p // the helper process runs in "/"
		}
		specDoc, specErr = loader.LoadFromFile(path)
		if specErr != nil {
			return
		}
		if specErr = specDoc.Validate(loader.Context); specErr != nil {
			specErr = fmt.Errorf("spec does not validate: %w", specErr)
			return
		}
		specRouter, specErr = gorillamux.NewRouter(specDoc)
	})
	return specDoc, specRouter, specErr
}

type stubFault struct {
	status int
	body   string
}

type stubVMM struct {
	doc    *openapi3.T
	router routers.Router

	mu         sync.Mutex
	state      VmState // "" until vm.create
	config     map[string]any
	vsock      net.Listener
	violations []string
	calls      []string
	faults     map[string]stubFault // by path, e.g. "/vm.info"
	hang       bool                 // never answer
	infoPad    int                  // pad vm.info with this many bytes
	stubborn   bool                 // vmm.shutdown answers but does not exit
	onShutdown func()               // vmm.shutdown
	// plugged are the disks added to the running VM, by ID, each
	// connected to its vhost-user backend as the VMM would be.
	plugged map[string]net.Conn
}

func newStubVMM() (*stubVMM, error) {
	doc, router, err := loadSpec()
	if err != nil {
		return nil, err
	}
	return &stubVMM{doc: doc, router: router, faults: map[string]stubFault{}}, nil
}

// startStub serves a stub VMM on a fresh socket for the test.
func startStub(t *testing.T) (*stubVMM, string) {
	t.Helper()
	s, err := newStubVMM()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(shortTempDir(t), "api.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s}
	go srv.Serve(ln)
	t.Cleanup(func() {
		srv.Close()
		s.closeVsock()
		for _, v := range s.getViolations() {
			t.Errorf("stub VMM: %s", v)
		}
	})
	return s, sock
}

// shortTempDir is a temp dir with a short path: Unix socket paths are
// limited to 107 bytes and t.TempDir embeds the test name.
func shortTempDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "chb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

func (s *stubVMM) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.violations = append(s.violations, msg)
	s.mu.Unlock()
	fmt.Fprintln(os.Stderr, "stub VMM violation:", msg)
}

func (s *stubVMM) getViolations() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.violations...)
}

func (s *stubVMM) getCalls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

func (s *stubVMM) setFault(path string, status int, body string) {
	s.mu.Lock()
	s.faults[path] = stubFault{status, body}
	s.mu.Unlock()
}

func (s *stubVMM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 16<<20))
	s.mu.Lock()
	hang := s.hang
	s.calls = append(s.calls, r.Method+" "+strings.TrimPrefix(r.URL.Path, "/api/v1"))
	s.mu.Unlock()
	if hang {
		<-r.Context().Done()
		return
	}

	r.URL.Scheme, r.URL.Host = "http", r.Host
	route, params, err := s.router.FindRoute(r)
	if err != nil {
		s.violate("%s %s: not in the spec: %v", r.Method, r.URL.Path, err)
		http.Error(w, "not in the API spec", http.StatusNotFound)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	in := &openapi3filter.RequestValidationInput{
		Request:    r,
		PathParams: params,
		Route:      route,
		Options:    &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc, MultiError: true},
	}
	if err := openapi3filter.ValidateRequest(r.Context(), in); err != nil {
		s.violate("%s %s: request does not match the spec: %v", r.Method, r.URL.Path, err)
		http.Error(w, "request does not match the spec: "+err.Error(), http.StatusBadRequest)
		return
	}
	if route.Operation.RequestBody == nil && len(body) > 0 {
		s.violate("%s %s: body sent to an operation without a request body", r.Method, r.URL.Path)
	}

	op := strings.TrimPrefix(r.URL.Path, "/api/v1")
	s.mu.Lock()
	f, faulted := s.faults[op]
	s.mu.Unlock()
	var status int
	var resp []byte
	if faulted {
		status, resp = f.status, []byte(f.body)
	} else {
		status, resp = s.handle(op, body)
	}

	hdr := http.Header{}
	if len(resp) > 0 {
		if status == http.StatusOK {
			hdr.Set("Content-Type", "application/json")
		} else {
			hdr.Set("Content-Type", "text/plain")
		}
	}
	// Success statuses must be ones the spec declares; error statuses the
	// spec leaves out (the real VMM answers 500 to many calls) are allowed.
	rin := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 status,
		Header:                 hdr,
		Body:                   io.NopCloser(bytes.NewReader(resp)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: status < 400, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(r.Context(), rin); err != nil {
		s.violate("%s %s: stub response %d does not match the spec: %v", r.Method, op, status, err)
		status, resp = http.StatusInternalServerError, []byte("stub response invalid")
	}
	for k, v := range hdr {
		w.Header()[k] = v
	}
	w.WriteHeader(status)
	w.Write(resp)
	if op == "/vmm.shutdown" && status == http.StatusNoContent && !s.stubborn && s.onShutdown != nil {
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		go s.onShutdown()
	}
}

func jsonBody(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// handle runs one operation against the stub's VM state.
func (s *stubVMM) handle(op string, body []byte) (int, []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	noVM := func() (int, []byte) { return http.StatusNotFound, []byte("VM is not created") }
	wrongState := func() (int, []byte) {
		return http.StatusMethodNotAllowed, []byte("VM is " + string(s.state))
	}
	switch op {
	case "/vmm.ping":
		return http.StatusOK, jsonBody(VmmPingResponse{BuildVersion: "v53.0-stub", Version: "53.0.0", Pid: int64(os.Getpid()), Features: []string{"kvm"}})
	case "/vmm.shutdown":
		return http.StatusNoContent, nil
	case "/vm.create":
		if s.state != "" {
			return http.StatusInternalServerError, []byte("VM is already created")
		}
		cfg, err := decodeNumbers(body)
		if err != nil {
			return http.StatusBadRequest, []byte(err.Error())
		}
		// The VMM connects to a vhost-user disk's backend as it creates
		// the device, and fails when nothing serves the socket.
		disks, _ := cfg["disks"].([]any)
		for _, d := range disks {
			if d, _ := d.(map[string]any); d["vhost_user"] == true {
				sock, _ := d["vhost_socket"].(string)
				c, err := net.DialTimeout("unix", sock, 2*time.Second)
				if err != nil {
					return http.StatusInternalServerError, []byte("vhost-user-blk: " + err.Error())
				}
				c.Close()
				if m, _ := cfg["memory"].(map[string]any); m["shared"] != true {
					return http.StatusInternalServerError, []byte("vhost-user devices need shared memory")
				}
			}
		}
		s.config, s.state = cfg, VmStateCreated
		return http.StatusNoContent, nil
	case "/vm.boot":
		switch s.state {
		case "":
			return noVM()
		case VmStateCreated:
			if err := s.startVsockLocked(); err != nil {
				return http.StatusInternalServerError, []byte(err.Error())
			}
			if err := s.startSerialLocked(); err != nil {
				return http.StatusInternalServerError, []byte(err.Error())
			}
			s.state = VmStateRunning
			return http.StatusNoContent, nil
		}
		return wrongState()
	case "/vm.info":
		if s.state == "" {
			return http.StatusInternalServerError, []byte("VM is not created")
		}
		info := map[string]any{"config": s.config, "state": s.state, "memory_actual_size": 256 << 20}
		if s.infoPad > 0 {
			info["device_tree"] = map[string]any{"pad": map[string]any{"id": strings.Repeat("x", s.infoPad)}}
		}
		return http.StatusOK, jsonBody(info)
	case "/vm.counters":
		if s.state == "" {
			return http.StatusInternalServerError, []byte("VM is not created")
		}
		return http.StatusOK, jsonBody(VmCounters{"_disk0": {"read_bytes": 512, "write_bytes": 0}, "_vsock2": {"tx": 3}})
	case "/vm.pause":
		switch s.state {
		case "":
			return noVM()
		case VmStateRunning:
			s.state = VmStatePaused
			return http.StatusNoContent, nil
		}
		return wrongState()
	case "/vm.resume":
		switch s.state {
		case "":
			return noVM()
		case VmStatePaused:
			s.state = VmStateRunning
			return http.StatusNoContent, nil
		}
		return wrongState()
	case "/vm.shutdown":
		switch s.state {
		case "":
			return noVM()
		case VmStateRunning, VmStatePaused:
			s.closeVsockLocked()
			s.state = VmStateShutdown
			return http.StatusNoContent, nil
		}
		return wrongState()
	case "/vm.delete":
		s.closeVsockLocked()
		s.state, s.config = "", nil
		return http.StatusNoContent, nil
	case "/vm.snapshot":
		switch s.state {
		case "":
			return noVM()
		case VmStatePaused:
		default:
			return wrongState()
		}
		var sc VmSnapshotConfig
		json.Unmarshal(body, &sc)
		dir, ok := strings.CutPrefix(sc.DestinationURL, "file://")
		if !ok {
			return http.StatusInternalServerError, []byte("unsupported destination " + sc.DestinationURL)
		}
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return http.StatusInternalServerError, []byte("destination is not a directory")
		}
		files := map[string][]byte{
			"config.json":   jsonBody(s.config),
			"state.json":    []byte(`{"stub":true}`),
			"memory-ranges": stubMemory(),
		}
		for name, data := range files {
			if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
				return http.StatusInternalServerError, []byte(err.Error())
			}
		}
		return http.StatusNoContent, nil
	case "/vm.add-disk":
		return s.addDiskLocked(body)
	case "/vm.remove-device":
		return s.removeDeviceLocked(body)
	case "/vm.restore":
		if s.state != "" {
			return http.StatusNotFound, []byte("VM is already created")
		}
		var rc RestoreConfig
		json.Unmarshal(body, &rc)
		return s.restoreLocked(rc)
	}
	s.violate("stub has no handler for %s", op)
	return http.StatusNotImplemented, []byte("stub: not implemented")
}

// restoreLocked checks a snapshot the way the VMM would use it: the
// config must be a VmConfig, its files and disks must exist and its vsock
// socket must be free to bind.
func (s *stubVMM) restoreLocked(rc RestoreConfig) (int, []byte) {
	dir, ok := strings.CutPrefix(rc.SourceURL, "file://")
	if !ok {
		return http.StatusInternalServerError, []byte("unsupported source " + rc.SourceURL)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return http.StatusInternalServerError, []byte(err.Error())
	}
	var plain any
	if err := json.Unmarshal(raw, &plain); err != nil {
		return http.StatusInternalServerError, []byte(err.Error())
	}
	if err := s.doc.Components.Schemas["VmConfig"].Value.VisitJSON(plain); err != nil {
		s.violate("restored config.json is not a VmConfig: %v", err)
		return http.StatusInternalServerError, []byte("config.json is not a VmConfig")
	}
	for _, name := range []string{"state.json", "memory-ranges"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return http.StatusInternalServerError, []byte("snapshot lacks " + name)
		}
	}
	// The guest's memory must come back as the snapshot wrote it.
	if mem, _ := os.ReadFile(filepath.Join(dir, "memory-ranges")); !bytes.Equal(mem, stubMemory()) {
		return http.StatusInternalServerError, []byte("memory-ranges is not the memory the snapshot saved")
	}
	cfg, _ := decodeNumbers(raw)
	var c VmConfig
	json.Unmarshal(raw, &c)
	for _, d := range c.Disks {
		if d.VhostUser {
			// (Its backend must serve the socket, as on create.)
			conn, err := net.DialTimeout("unix", d.VhostSocket, 2*time.Second)
			if err != nil {
				return http.StatusInternalServerError, []byte("vhost-user-blk: " + err.Error())
			}
			conn.Close()
			continue
		}
		if _, err := os.Stat(d.Path); err != nil {
			return http.StatusInternalServerError, []byte("disk: " + err.Error())
		}
	}
	s.config = cfg
	if err := s.startVsockLocked(); err != nil {
		s.config = nil
		return http.StatusInternalServerError, []byte("restore vsock: " + err.Error())
	}
	if err := s.startSerialLocked(); err != nil {
		s.closeVsockLocked()
		s.config = nil
		return http.StatusInternalServerError, []byte("restore serial: " + err.Error())
	}
	s.state = VmStatePaused
	if rc.Resume {
		s.state = VmStateRunning
	}
	return http.StatusNoContent, nil
}

func decodeNumbers(b []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var m map[string]any
	err := dec.Decode(&m)
	return m, err
}

// stubMemoryLine fills the stub guest's memory image: a canary tests
// look for in plain text on the host.
const stubMemoryLine = "stub guest: memory canary 0c7d41\n"

// stubMemory is the stub guest's memory image, larger than one sealed
// record.
func stubMemory() []byte {
	return bytes.Repeat([]byte(stubMemoryLine), (600<<10)/len(stubMemoryLine))
}

// stubSerialLine is what the stub's guest prints on its serial port, once
// to every client of a Socket-mode serial port.
const stubSerialLine = "stub guest: console canary 5f1c9e\n"

// startSerialLocked serves a Socket-mode serial port, as the VMM does.
func (s *stubVMM) startSerialLocked() error {
	c, _ := s.config["serial"].(map[string]any)
	if c["mode"] != string(ConsoleModeSocket) {
		return nil
	}
	path, _ := c["socket"].(string)
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	go func() {
		var held []net.Conn // (open, as a VMM holds its client, until it exits)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Write([]byte(stubSerialLine))
			held = append(held, conn)
		}
	}()
	return nil
}

// startVsockLocked binds the VM's hybrid vsock socket, as the VMM does.
func (s *stubVMM) startVsockLocked() error {
	v, _ := s.config["vsock"].(map[string]any)
	path, _ := v["socket"].(string)
	if path == "" {
		return nil
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	s.vsock = ln
	go serveHybridVsock(ln, map[uint32]bool{hypervisor.AgentPort: true})
	return nil
}

func (s *stubVMM) closeVsockLocked() {
	if s.vsock != nil {
		s.vsock.Close()
		s.vsock = nil
	}
	for id, c := range s.plugged {
		c.Close()
		delete(s.plugged, id)
	}
}

// addDiskLocked hot-plugs a vhost-user disk as the VMM does: into a VM
// that runs, with memory shared, connected to its backend at once, under
// an ID no other device has.
func (s *stubVMM) addDiskLocked(body []byte) (int, []byte) {
	if s.state != VmStateRunning && s.state != VmStatePaused {
		return http.StatusInternalServerError, []byte("VM is not running")
	}
	var d DiskConfig
	if err := json.Unmarshal(body, &d); err != nil {
		return http.StatusBadRequest, []byte(err.Error())
	}
	if !d.VhostUser || d.VhostSocket == "" || d.Path != "" {
		s.violate("vm.add-disk: the backend adds only vhost-user disks, got %s", body)
		return http.StatusInternalServerError, []byte("stub: not a vhost-user disk")
	}
	if m, _ := s.config["memory"].(map[string]any); m["shared"] != true {
		return http.StatusInternalServerError, []byte("vhost-user devices need shared memory")
	}
	if _, taken := s.plugged[d.ID]; taken || d.ID == "" {
		return http.StatusInternalServerError, []byte("device id " + d.ID + " is taken (or empty)")
	}
	c, err := net.DialTimeout("unix", d.VhostSocket, 2*time.Second)
	if err != nil {
		return http.StatusInternalServerError, []byte("vhost-user-blk: " + err.Error())
	}
	if s.plugged == nil {
		s.plugged = map[string]net.Conn{}
	}
	s.plugged[d.ID] = c
	// (The VM's config lists a disk plugged in, as the VMM's does.)
	var disk map[string]any
	json.Unmarshal(body, &disk)
	disks, _ := s.config["disks"].([]any)
	s.config["disks"] = append(disks, disk)
	return http.StatusOK, jsonBody(PciDeviceInfo{ID: d.ID, BDF: fmt.Sprintf("0000:00:%02x.0", 5+len(s.plugged))})
}

// removeDeviceLocked unplugs a device added earlier.
func (s *stubVMM) removeDeviceLocked(body []byte) (int, []byte) {
	var r VmRemoveDevice
	json.Unmarshal(body, &r)
	c, ok := s.plugged[r.ID]
	if !ok {
		return http.StatusNotFound, []byte("no device " + r.ID)
	}
	c.Close()
	delete(s.plugged, r.ID)
	disks, _ := s.config["disks"].([]any)
	s.config["disks"] = slices.DeleteFunc(disks, func(d any) bool { m, _ := d.(map[string]any); return m["id"] == r.ID })
	return http.StatusNoContent, nil
}

func (s *stubVMM) closeVsock() {
	s.mu.Lock()
	s.closeVsockLocked()
	s.mu.Unlock()
}

// serveHybridVsock is the VMM side of hybrid vsock: "CONNECT <port>\n" is
// answered with "OK <n>\n" and an echo when something listens on that
// guest port, else the connection is closed.
func serveHybridVsock(ln net.Listener, ports map[uint32]bool) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, err := bufio.NewReaderSize(c, 16).ReadString('\n')
			if err != nil {
				return
			}
			c.SetReadDeadline(time.Time{})
			port, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSuffix(line, "\n"), "CONNECT "), 10, 32)
			if err != nil || !strings.HasPrefix(line, "CONNECT ") || !ports[uint32(port)] {
				return
			}
			fmt.Fprintf(c, "OK %d\n", stubHostPort)
			if os.Getenv(stubAgentEnv) == "1" {
				serveStubAgent(c)
				return
			}
			io.Copy(c, c)
		}()
	}
}

// The stub guest's agent (HAREBOX_CH_STUB_AGENT=1): the real agent
// transport (a session, its hello, Health naming it) over each vsock
// connection, with calls that answer at once (Health) or never (Stat).
// SIGUSR1 kills it: every connection closes, as the VMM closes a vsock
// connection whose guest end is gone.
var (
	agentMu    sync.Mutex
	agentConns = map[net.Conn]bool{}
	agentKill  sync.Once
)

type stubAgent struct {
	agentpb.UnimplementedAgentServer
}

func (stubAgent) Health(context.Context, *agentpb.HealthRequest) (*agentpb.HealthResponse, error) {
	return &agentpb.HealthResponse{Version: "stub", Mode: "service", Protocol: layout.Protocol}, nil
}

func (stubAgent) Stat(ctx context.Context, _ *agentpb.PathRequest) (*agentpb.FileInfo, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func serveStubAgent(c net.Conn) {
	agentKill.Do(func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGUSR1)
		go func() {
			for range sig {
				agentMu.Lock()
				for conn := range agentConns {
					conn.Close()
				}
				agentMu.Unlock()
			}
		}()
	})
	agentMu.Lock()
	agentConns[c] = true
	agentMu.Unlock()
	defer func() {
		agentMu.Lock()
		delete(agentConns, c)
		agentMu.Unlock()
	}()
	guest.ServeConn(context.Background(), c, stubAgent{})
}

// stubProcessMain runs the stub as a stand-in cloud-hypervisor binary. It
// accepts exactly the arguments the launcher passes.
func stubProcessMain(args []string) int {
	if len(args) == 1 && args[0] == "--version" {
		v := os.Getenv(stubVersionEnv)
		if v == "" {
			v = "v53.0"
		}
		fmt.Println("cloud-hypervisor " + v)
		return 0
	}
	if os.Getenv(stubFailEnv) == "1" {
		fmt.Fprintln(os.Stderr, "stub: Failed to open hypervisor interface (is hypervisor interface available?)")
		return 1
	}
	if len(args) != 4 || args[0] != "--api-socket" || !strings.HasPrefix(args[1], "path=") || args[2] != "--seccomp" || args[3] != "true" {
		fmt.Fprintf(os.Stderr, "stub: unexpected arguments %q\n", args)
		return 2
	}
	sock := strings.TrimPrefix(args[1], "path=")
	s, err := newStubVMM()
	if err != nil {
		fmt.Fprintln(os.Stderr, "stub:", err)
		return 1
	}
	s.stubborn = os.Getenv(stubStubborn) == "1"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stub:", err)
		return 1
	}
	done := make(chan struct{})
	var once sync.Once
	s.onShutdown = func() { once.Do(func() { close(done) }) }
	srv := &http.Server{Handler: s}
	go srv.Serve(ln)

	// The real VMM outlives its parent; the stub must not outlive the test.
	parent := os.Getppid()
	go func() {
		for os.Getppid() == parent {
			time.Sleep(100 * time.Millisecond)
		}
		s.onShutdown()
	}()
	<-done
	time.Sleep(20 * time.Millisecond) // let the vmm.shutdown answer go out
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	srv.Shutdown(ctx)
	s.closeVsock()
	if len(s.getViolations()) > 0 {
		return 3
	}
	return 0
}

func TestMain(m *testing.M) {
	if os.Getenv(stubEnv) == "1" {
		os.Exit(stubProcessMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}
