// Command testlog reads `go test -json` on its standard input and prints
// what `go test` would without -json: each package's result line, and the
// whole output of a test that failed (or was still running when its
// package failed: a timeout or a panic). Lines that are not JSON (the go
// command's own) pass as they are. It also keeps each test's time, so
// `make test` can end with its slowest tests: a test's time is from its
// start (or its resumption, if it is parallel) to its end, subtests
// included. (go test's own time for a test whose subtests are parallel
// ends with its function, before they run.)
//
//	go test -json ./... | testlog -save times.tsv [-slowest 10]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	ImportPath string // build events
	Test       string
	Elapsed    float64
	Output     string
	Time       time.Time
}

func main() {
	save := flag.String("save", "", "append each finished test's time to this file (tab-separated)")
	slowest := flag.Int("slowest", 0, "at the end, print this many of the slowest top-level tests in the -save file, and its counts")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, *save, *slowest); err != nil {
		fmt.Fprintln(os.Stderr, "testlog:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer, save string, slowest int) error {
	var times io.Writer = io.Discard
	if save != "" {
		f, err := os.OpenFile(save, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		times = f
	}
	held := map[string][]string{}     // package + "\x00" + test: its output so far
	started := map[string]time.Time{} // and when it started, or last resumed
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		key := e.Package + "\x00" + e.Test
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Action == "output" && e.Test == "":
			if e.Output != "PASS\n" {
				fmt.Fprint(out, e.Output)
			}
		case e.Action == "output":
			held[key] = append(held[key], e.Output)
		case e.Test != "" && (e.Action == "run" || e.Action == "cont"):
			started[key] = e.Time
		case e.Test != "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			if e.Action == "fail" {
				fmt.Fprint(out, strings.Join(held[key], ""))
			}
			delete(held, key)
			took := e.Elapsed
			if t, ok := started[key]; ok && !t.IsZero() && !e.Time.IsZero() {
				took = max(took, e.Time.Sub(t).Seconds())
			}
			delete(started, key)
			fmt.Fprintf(times, "%.2f\t%s\t%s\t%s\n", took, e.Package, e.Test, e.Action)
		case e.Test == "" && e.Action == "fail":
			// Tests still running when their package failed: their output
			// says why (a timeout's stacks, a panic).
			prefix := e.Package + "\x00"
			for _, k := range slices.Sorted(maps.Keys(held)) {
				if strings.HasPrefix(k, prefix) {
					fmt.Fprint(out, strings.Join(held[k], ""))
					delete(held, k)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if slowest > 0 && save != "" {
		return printSlowest(out, save, slowest)
	}
	return nil
}

// printSlowest prints the n slowest top-level tests recorded in file,
// then how many tests (subtests included) passed, failed and skipped.
func printSlowest(out io.Writer, file string, n int) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	type rec struct {
		d         time.Duration
		pkg, test string
	}
	var rs []rec
	count := map[string]int{}
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		if len(f) != 4 {
			continue
		}
		count[f[3]]++
		if strings.Contains(f[2], "/") || f[3] == "skip" {
			continue
		}
		s, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		rs = append(rs, rec{time.Duration(s * float64(time.Second)), f[1], f[2]})
	}
	slices.SortStableFunc(rs, func(a, b rec) int { return int(b.d - a.d) })
	fmt.Fprintf(out, "the %d slowest tests:\n", min(n, len(rs)))
	for _, r := range rs[:min(n, len(rs))] {
		fmt.Fprintf(out, "  %8.1fs  %s  %s\n", r.d.Seconds(), r.pkg, r.test)
	}
	fmt.Fprintf(out, "tests: %d passed, %d failed, %d skipped\n", count["pass"], count["fail"], count["skip"])
	return nil
}
