package harebox_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/harebox/harebox"
	"github.com/harebox/harebox/backends/qemu"
	"github.com/harebox/harebox/hypervisor"
	"github.com/harebox/harebox/sandbox"
)

// A cold boot that stalls is paused and resumed, then launched again on
// a new machine, and the create succeeds. The first machine is a real
// guest whose agent the engine cannot reach: it boots and then sits
// idle unanswered, as the rare boots that never answered did; or it
// spends the CPU allowed without an answer.
func TestBootStalled(t *testing.T) {
	for _, c := range []struct {
		name, want string
		idle, cpu  time.Duration
	}{
		// Each case with only its own rule in reach. (The minimal image
		// boots in about 5 CPU-s under TCG: the CPU rule fires while the
		// first machine still boots, which is all it looks at.)
		{"idle", "sat idle", 5 * time.Second, time.Hour},
		{"spun", "spun", time.Hour, 3 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v := newEnv(t)
			qh, err := qemu.New(qemu.Options{})
			if err != nil {
				t.Fatal(err)
			}
			hv := &stallFirst{Hypervisor: qh}
			var logs lockedBuffer
			o := v.options()
			o.Hypervisor, o.Logger = hv, slog.New(slog.NewTextHandler(&logs, nil))
			harebox.SetBootStall(&o, c.idle, c.cpu)
			eng, err := harebox.New(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			box := create(t, eng, sandbox.CreateRequest{})
			defer eng.Delete(context.Background(), box.ID)
			if r := run(t, eng, box.ID, "echo up"); r.Stdout != "up\n" {
				t.Fatalf("exec on the relaunched machine: %+v", r)
			}
			if n := len(hv.launched); n != 2 {
				t.Fatalf("%d launches, want 2", n)
			}
			// The stalled machine is gone: its VMM and its files.
			if info, err := hv.launched[0].Info(context.Background()); err != nil || info.State != hypervisor.StateStopped {
				t.Errorf("the stalled machine: %+v %v", info, err)
			}
			out := logs.String()
			for _, w := range []string{"a boot stalled", c.want, "the stalled boot is launched again"} {
				if !strings.Contains(out, w) {
					t.Errorf("the log does not say %q:\n%s", w, out)
				}
			}
		})
	}
}

// A golden snapshot's boot that stalls is launched again too, and the
// pool it is for fills.
func TestGoldenBootStalled(t *testing.T) {
	t.Parallel()
	v := newEnv(t)
	qh, err := qemu.New(qemu.Options{})
	if err != nil {
		t.Fatal(err)
	}
	hv := &stallFirst{Hypervisor: qh, golden: true}
	var logs lockedBuffer
	o := v.options()
	o.Hypervisor, o.Logger = hv, slog.New(slog.NewTextHandler(&logs, nil))
	o.Pool = map[string]int{"minimal:small": 1}
	harebox.SetBootStall(&o, 5*time.Second, time.Hour)
	eng, err := harebox.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		st, err := eng.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.Pool > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pool did not fill:\n%s", logs.String())
		}
	}
	out := logs.String()
	for _, w := range []string{"a golden boot stalled", "sat idle", "the stalled golden boot is launched again", "golden snapshot ready"} {
		if !strings.Contains(out, w) {
			t.Errorf("the log does not say %q:\n%s", w, out)
		}
	}
	if n := hv.goldens(); n != 2 {
		t.Errorf("%d golden launches, want 2", n)
	}
}

// stallFirst gives its first machine (its first golden machine, if
// golden) an agent endpoint nowhere, so the engine never hears its
// agent.
type stallFirst struct {
	hypervisor.Hypervisor
	golden   bool
	mu       sync.Mutex
	stalled  bool
	launched []hypervisor.Machine
	specs    []hypervisor.Spec
}

func (h *stallFirst) Launch(ctx context.Context, spec hypervisor.Spec) (hypervisor.Machine, error) {
	h.mu.Lock()
	stall := !h.stalled && (!h.golden || spec.Labels["harebox.golden"] != "")
	h.stalled = h.stalled || stall
	h.mu.Unlock()
	m, err := h.Hypervisor.Launch(ctx, spec)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.launched, h.specs = append(h.launched, m), append(h.specs, spec)
	h.mu.Unlock()
	if stall {
		return unreachable{m}, nil
	}
	return m, nil
}

// goldens counts the golden machines launched.
func (h *stallFirst) goldens() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, s := range h.specs {
		if s.Labels["harebox.golden"] != "" {
			n++
		}
	}
	return n
}

type unreachable struct{ hypervisor.Machine }

func (unreachable) AgentEndpoint() hypervisor.AgentEndpoint {
	return hypervisor.AgentEndpoint{Transport: hypervisor.TransportSerial, Path: "/nonexistent/agent.sock"}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
