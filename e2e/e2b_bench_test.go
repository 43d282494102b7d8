package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
)

// BenchmarkE2BSDK: the unmodified E2B SDK next to HareBox's own
// TypeScript SDK against one hareboxd, on the Debian image from a golden
// snapshot, interleaved in one run (e2e/e2bsdk/bench.mjs): create to the
// end of a first `true`, and one `true`'s round trip; the ratios are of
// the medians (b.N creates of each, 4 round trips per create).
func BenchmarkE2BSDK(b *testing.B) {
	s := testserver.Prepare(b)
	dataDir, err := os.MkdirTemp("", "hbe2bb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	addr := testserver.FreeAddr(b)
	srv := testserver.Start(b, s, dataDir, "--golden-snapshots", "--e2b-listen", addr, "--e2b-templates", "base=default")
	defer func() { testserver.Finish(b, srv, dataDir) }()
	secret := srv.E2BKey(b)
	dir := filepath.Join(s.Root, "e2e", "e2bsdk")
	testserver.NPMInstalled(b, srv, s, dir)
	sdk := filepath.Join(s.Root, "sdk", "typescript")
	testserver.NPMInstalled(b, srv, s, sdk)
	testserver.Run(b, srv, s, sdk, 5*time.Minute, "npm", "run", "build", "--silent")
	// A first create of each boots the golden snapshot: not measured.
	testserver.Run(b, srv, s, dir, 10*time.Minute, "env", "BENCH_N=1", "BENCH_TRIPS=1",
		"E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+secret, "node", "bench.mjs")
	b.ResetTimer()
	out := testserver.Run(b, srv, s, dir, 30*time.Minute, "env", "BENCH_N="+strconv.Itoa(b.N), "BENCH_TRIPS="+strconv.Itoa(4*b.N),
		"E2B_API_URL=http://"+addr, "E2B_SANDBOX_URL=http://"+addr, "E2B_API_KEY="+secret, "node", "bench.mjs")
	b.StopTimer()
	var got map[string][]float64
	if err := json.Unmarshal([]byte(testserver.LastLines(strings.TrimSpace(out), 1)), &got); err != nil {
		b.Fatalf("bench.mjs: %v\n%s", err, out)
	}
	med := func(k string) float64 {
		v := slices.Clone(got[k])
		if len(v) == 0 {
			b.Fatalf("bench.mjs: no %s", k)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	b.ReportMetric(med("e2bCreateRun"), "e2b-create-run-ms")
	b.ReportMetric(med("hbCreateRun"), "harebox-create-run-ms")
	b.ReportMetric(med("e2bCreateRun")/med("hbCreateRun"), "e2b/harebox-create")
	b.ReportMetric(med("e2bRun"), "e2b-run-ms")
	b.ReportMetric(med("hbRun"), "harebox-run-ms")
	b.ReportMetric(med("e2bRun")/med("hbRun"), "e2b/harebox-run")
	b.ReportMetric(med("hbBashRun"), "harebox-bash-run-ms")
	b.ReportMetric(med("e2bRun")/med("hbBashRun"), "e2b/harebox-bash-run")
}
