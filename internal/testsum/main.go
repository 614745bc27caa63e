// Command testsum reads the event stream of `go test -json` on its standard
// input and prints what a plain `go test` run prints: a line per package,
// and the whole output of every test that failed. At the end it lists the
// slowest tests, so that a slow run says where its time went.
//
//	go test -json ./... | go run ./internal/testsum
//
// It exits 1 when a package or a test failed, or when a package did not
// build.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json's TestEvent).
type event struct {
	Time        time.Time
	Action      string
	Package     string
	ImportPath  string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
}

// slowest is how many tests the summary lists.
const slowest = 30

func main() {
	failed, err := summarize(os.Stdin, os.Stdout, slowest)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsum:", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

// timing is one finished top-level test.
type timing struct {
	pkg, test string
	elapsed   float64
}

// summarize copies the stream in to out as described above and reports
// whether anything failed.
func summarize(in io.Reader, out io.Writer, top int) (failed bool, err error) {
	held := map[string][]string{} // package + "\x00" + test: output so far
	var times []timing
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(out, string(line)) // not an event: go's own words
			continue
		}
		// A subtest's output belongs to its top-level test, in the order
		// it came.
		name, _, isSub := strings.Cut(e.Test, "/")
		key := e.Package + "\x00" + name
		switch {
		case e.Action == "build-output":
			fmt.Fprint(out, e.Output)
		case e.Action == "build-fail":
			failed = true
		case e.Test == "":
			switch e.Action {
			case "output":
				if e.Output != "PASS\n" {
					fmt.Fprint(out, e.Output)
				}
			case "fail":
				failed = true
				// A package that panicked or timed out leaves tests
				// without an end: their output says why.
				for k, lines := range held {
					if strings.HasPrefix(k, e.Package+"\x00") {
						fmt.Fprint(out, strings.Join(lines, ""))
						delete(held, k)
					}
				}
			}
		case e.Action == "output":
			held[key] = append(held[key], e.Output)
		case isSub:
			// A subtest's end: its top-level test's end decides.
		case e.Action == "fail":
			failed = true
			fmt.Fprint(out, strings.Join(held[key], ""))
			delete(held, key)
			times = append(times, timing{e.Package, e.Test, e.Elapsed})
		case e.Action == "pass":
			delete(held, key)
			times = append(times, timing{e.Package, e.Test, e.Elapsed})
		case e.Action == "skip":
			delete(held, key)
		}
	}
	if err := sc.Err(); err != nil {
		return failed, err
	}
	sort.Slice(times, func(i, j int) bool { return times[i].elapsed > times[j].elapsed })
	if len(times) > top {
		times = times[:top]
	}
	if len(times) > 0 {
		fmt.Fprintf(out, "== the %d slowest tests\n", len(times))
		for _, t := range times {
			fmt.Fprintf(out, "%8.1fs  %s  %s\n", t.elapsed, t.pkg, t.test)
		}
	}
	return failed, nil
}
