package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/harebox/harebox/authz"
	"github.com/harebox/harebox/monitor"
	"github.com/harebox/harebox/sandbox"
)

func (s *Server) getSandboxMetrics(w http.ResponseWriter, r *http.Request) error {
	qv := r.URL.Query()
	var q monitor.Query
	for name, into := range map[string]*time.Time{"from": &q.From, "to": &q.To} {
		if v := qv.Get(name); v != "" {
			t, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return badRequest(name, "not an RFC 3339 time: %q", v)
			}
			*into = t
		}
	}
	if v := qv.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return badRequest("limit", "must be 1 to 10000")
		}
		q.Limit = n
	}
	l, err := s.monitor.Metrics(r.Context(), r.PathValue("id"), q)
	return reply(w, http.StatusOK, map[string]any{"samples": l}, err)
}

// engineCollector exposes the engine's counts to Prometheus.
type engineCollector struct {
	eng                              Engine
	sandboxes, busy, reserved, limit *prometheus.Desc
	pool, creates, phases            *prometheus.Desc
}

func newEngineCollector(eng Engine) *engineCollector {
	return &engineCollector{
		eng:       eng,
		sandboxes: prometheus.NewDesc("harebox_sandboxes", "Live sandboxes by state.", []string{"state"}, nil),
		busy:      prometheus.NewDesc("harebox_sandboxes_busy", "Live sandboxes in a lifecycle call when sampled.", nil, nil),
		reserved:  prometheus.NewDesc("harebox_reserved", "What admitted sandboxes reserve on this host.", []string{"resource"}, nil),
		limit:     prometheus.NewDesc("harebox_admission_limit", "What admission allows on this host.", []string{"resource"}, nil),
		pool:      prometheus.NewDesc("harebox_pool_idle", "Idle warm-pool sandboxes ready to be claimed.", nil, nil),
		creates:   prometheus.NewDesc("harebox_create_seconds", "Creates since the server started and how long they took, by how they were served (boot, snapshot, pool).", []string{"served"}, nil),
		phases:    prometheus.NewDesc("harebox_create_phase_seconds_total", "Time the creates spent in each step, by how they were served.", []string{"served", "phase"}, nil),
	}
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.sandboxes
	ch <- c.busy
	ch <- c.reserved
	ch <- c.limit
	ch <- c.pool
	ch <- c.creates
	ch <- c.phases
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	// (The handler checked the caller; the collector reads as the
	// operator.)
	st, err := c.eng.Stats(authz.WithPrincipal(context.Background(), authz.Operator))
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.sandboxes, err)
		return
	}
	for _, state := range []sandbox.State{sandbox.StateCreating, sandbox.StateRunning, sandbox.StatePaused, sandbox.StateStopped, sandbox.StateHibernated} {
		ch <- prometheus.MustNewConstMetric(c.sandboxes, prometheus.GaugeValue, float64(st.Sandboxes[state]), string(state))
	}
	ch <- prometheus.MustNewConstMetric(c.busy, prometheus.GaugeValue, float64(st.Busy))
	ch <- prometheus.MustNewConstMetric(c.pool, prometheus.GaugeValue, float64(st.Pool))
	for served, cs := range st.Creates {
		ch <- prometheus.MustNewConstSummary(c.creates, uint64(cs.Count), cs.Seconds, nil, served)
		for phase, secs := range cs.Phases {
			ch <- prometheus.MustNewConstMetric(c.phases, prometheus.CounterValue, secs, served, phase)
		}
	}
	for _, r := range []struct {
		name       string
		used, most int
	}{
		{"vcpus", st.Reserved.VCPUs, st.Limit.VCPUs},
		{"memory_mb", st.Reserved.MemoryMB, st.Limit.MemoryMB},
		{"disk_gb", st.Reserved.DiskGB, st.Limit.DiskGB},
	} {
		ch <- prometheus.MustNewConstMetric(c.reserved, prometheus.GaugeValue, float64(r.used), r.name)
		ch <- prometheus.MustNewConstMetric(c.limit, prometheus.GaugeValue, float64(r.most), r.name)
	}
}

// metricsHandler serves the Prometheus text format: the engine's counts,
// and this process's and the Go runtime's.
func metricsHandler(eng Engine) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newEngineCollector(eng), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}

func (s *Server) getServerMetrics(w http.ResponseWriter, r *http.Request) error {
	if err := monitor.MayReadServer(authz.From(r.Context())); err != nil {
		return err
	}
	s.metrics.ServeHTTP(w, r)
	return nil
}
