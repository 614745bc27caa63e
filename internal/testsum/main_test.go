package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSummarize runs a real `go test -json` over a small module whose tests
// pass, fail in a subtest, log and skip, and one package that does not
// build, and checks what the summary keeps.
func TestSummarize(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/m\n\ngo 1.22\n")
	write("good/good_test.go", `package good
import "testing"
func TestQuiet(t *testing.T) { t.Log("words of a passing test") }
func TestSkipped(t *testing.T) { t.Skip("words of a skipped test") }
`)
	write("bad/bad_test.go", `package bad
import "testing"
func TestFine(t *testing.T) { t.Log("words of a passing test") }
func TestBroken(t *testing.T) {
	t.Log("before the subtests")
	t.Run("ok", func(t *testing.T) { t.Log("words of a passing subtest") })
	t.Run("wrong", func(t *testing.T) { t.Error("the subtest's own complaint") })
}
`)
	write("nobuild/nobuild_test.go", `package nobuild
import "testing"
func TestX(t *testing.T) { undefinedName() }
`)
	cmd := exec.Command(goBin, "test", "-json", "-count=1", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	stream, _ := cmd.Output() // it fails: two packages do
	if len(stream) == 0 {
		t.Fatal("go test -json printed nothing")
	}

	var out bytes.Buffer
	failed, err := summarize(bytes.NewReader(stream), &out, 3)
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("summarize reported no failure")
	}
	got := out.String()
	for _, want := range []string{
		"ok  \texample.com/m/good",
		"FAIL\texample.com/m/bad",
		"before the subtests",
		"words of a passing subtest", // part of the failed test's story
		"the subtest's own complaint",
		"--- FAIL: TestBroken",
		"undefined: undefinedName",
		"== the 3 slowest tests",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	for _, unwanted := range []string{
		"words of a passing test",
		"words of a skipped test",
		"{\"",
	} {
		if strings.Contains(got, unwanted) {
			t.Errorf("summary holds %q:\n%s", unwanted, got)
		}
	}

	// A clean run reports no failure.
	var clean bytes.Buffer
	good := []byte{}
	for _, line := range bytes.SplitAfter(stream, []byte("\n")) {
		if bytes.Contains(line, []byte(`"Package":"example.com/m/good"`)) {
			good = append(good, line...)
		}
	}
	failed, err = summarize(bytes.NewReader(good), &clean, 3)
	if err != nil || failed {
		t.Errorf("summarize of a passing package: failed %v, err %v:\n%s", failed, err, clean.String())
	}
}
