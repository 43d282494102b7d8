package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/harebox/harebox/internal/testserver"
	"github.com/harebox/harebox/sandbox"
)

// BenchmarkVolumes: a volume next to the sandbox's own root disk, in the
// same guest (the Debian image, restored from its golden snapshot; both
// are encrypted qcow2 files on the host): sequential write and read,
// random 4 KiB reads and synced writes (e2e/testdata/volbench), as
// ratios volume/root; a create with a volume next to one without, in
// turn, as a ratio of the medians; and a create that attaches the volume
// read-only beside its running writer, which moves onto a new layer
// meanwhile: its admission (where the move is) next to the writer's.
func BenchmarkVolumes(b *testing.B) {
	s := testserver.Prepare(b)
	dataDir, err := os.MkdirTemp("", "hbvb")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dataDir)
	srv := testserver.Start(b, s, dataDir, "--golden-snapshots")
	defer func() { testserver.Finish(b, srv, dataDir) }()
	cli := &testserver.CLI{T: b, S: s, Srv: srv}
	cli.OK("", nil, "volume", "create", "bench", "--size", "2")
	script := filepath.Join(s.Root, "e2e", "testdata", "volbench", "volbench.py")
	create := func(args ...string) (sandbox.Sandbox, time.Duration) {
		var box sandbox.Sandbox
		start := time.Now()
		cli.OK("", &box, append([]string{"new", "--image", "default", "--ttl", "900"}, args...)...)
		return box, time.Since(start)
	}
	// Until a create is served from the golden snapshot: not measured.
	for deadline := time.Now().Add(5 * time.Minute); ; {
		box, _ := create()
		cli.OK("", nil, "delete", box.ID)
		if box.Served == "snapshot" {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("no create served from the golden snapshot in 5 minutes")
		}
		time.Sleep(5 * time.Second)
	}
	m := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		plain, tPlain := create()
		cli.OK("", nil, "delete", plain.ID)
		box, tVol := create("--volume", "bench:/mnt/vol")
		m["create"] = append(m["create"], float64(tPlain.Milliseconds()))
		m["create-volume"] = append(m["create-volume"], float64(tVol.Milliseconds()))
		// (Before the writer's I/O, whose writeback on the host would
		// slow the reader's restore.)
		reader, tReader := create("--volume", "bench:/mnt/ro:ro")
		m["create-reader"] = append(m["create-reader"], float64(tReader.Milliseconds()))
		m["admit-reader"] = append(m["admit-reader"], reader.CreatePhases["admit"])
		m["admit-writer"] = append(m["admit-writer"], box.CreatePhases["admit"])
		cli.OK("", nil, "delete", reader.ID)
		cli.OK("", nil, "file", "write", box.ID, "--path", "/tmp/volbench.py", "--from", script)
		out := cli.OK("", nil, "exec", box.ID, "--user", "root", "--timeout", "600", "--", "python3", "/tmp/volbench.py", "/mnt/vol", "/root")
		var r map[string]map[string]float64
		if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &r); err != nil {
			b.Fatalf("volbench: %v: %q", err, out)
		}
		for k, v := range r["/mnt/vol"] {
			m["volume-"+k] = append(m["volume-"+k], v)
		}
		for k, v := range r["/root"] {
			m["root-"+k] = append(m["root-"+k], v)
		}
		cli.OK("", nil, "delete", box.ID)
	}
	b.StopTimer()
	med := func(k string) float64 {
		v := slices.Clone(m[k])
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, k := range []string{"seq_write", "seq_read", "rand_read", "rand_write"} {
		unit := "MB/s"
		if strings.HasPrefix(k, "rand") {
			unit = "IOPS"
		}
		b.ReportMetric(med("volume-"+k), "volume-"+k+"-"+unit)
		b.ReportMetric(med("root-"+k), "root-"+k+"-"+unit)
		b.ReportMetric(med("volume-"+k)/med("root-"+k), "volume/root-"+k)
	}
	b.ReportMetric(med("create"), "create-ms")
	b.ReportMetric(med("create-volume"), "create-volume-ms")
	b.ReportMetric(med("create-volume")/med("create"), "with/without-volume-create")
	// (The reader's create runs beside the writer's VM, the others alone:
	// its admission is where the move is.)
	b.ReportMetric(med("create-reader"), "create-reader-beside-writer-ms")
	b.ReportMetric(med("admit-reader"), "admit-reader-beside-writer-ms")
	b.ReportMetric(med("admit-writer"), "admit-writer-ms")
}
