package e2b

import (
	"net/http"
	"strconv"
	"time"

	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/store"
)

// Metric is SandboxMetric. HareBox samples a sandbox from the host side
// (package monitor), so each field is what the host sees: CPU from the
// VMM's CPU time between two samples, memory the VMM's resident memory
// (the guest's page cache included: memCache is 0, not seen from the
// host), disk what the sandbox's disk files take on the host.
type Metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int32     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics is GET /sandboxes/{id}/metrics?start=&end= (Unix seconds): the
// sandbox's samples in the interval, oldest first (none for a sandbox
// created with monitoring off).
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) error {
	var q monitor.Query
	for _, p := range []struct {
		name string
		at   *time.Time
	}{{"start", &q.From}, {"end", &q.To}} {
		v := r.URL.Query().Get(p.name)
		if v == "" {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > 1<<40 {
			return badRequest("%s must be a Unix time in seconds", p.name)
		}
		*p.at = time.Unix(n, 0)
	}
	if !q.To.IsZero() {
		q.To = q.To.Add(time.Second) // (end is inclusive in E2B)
	}
	ctx := r.Context()
	box, err := h.lookup(ctx, r.PathValue("id"))
	if err != nil {
		return err
	}
	samples, err := h.o.Engine.Monitor().Metrics(ctx, box.ID, q)
	if err != nil {
		return err
	}
	out := make([]Metric, 0, len(samples))
	var prev *store.MetricSample
	for _, s := range samples {
		m := Metric{Timestamp: s.Time.UTC(), TimestampUnix: s.Time.Unix(), CPUCount: int32(box.Size.VCPUs),
			MemUsed: s.MemoryBytes, MemTotal: int64(box.Size.MemoryMB) << 20, DiskUsed: s.DiskBytes,
			DiskTotal: int64(box.Size.DiskGB) << 30}
		if prev != nil && box.Size.VCPUs > 0 {
			if dt := s.Time.Sub(prev.Time).Seconds(); dt > 0 && s.CPUSeconds >= prev.CPUSeconds {
				m.CPUUsedPct = min(100, 100*(s.CPUSeconds-prev.CPUSeconds)/dt/float64(box.Size.VCPUs))
			}
		}
		prev = s
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
