package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBenchRevision: run from a folder outside any checkout with a matrix
// reached through a symbolic link into this checkout, the revision is this
// checkout's, not "unknown".
func TestBenchRevision(t *testing.T) {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	want := strings.TrimSpace(string(out))
	matrix, err := filepath.Abs("../../configs/bench/strata-smoke.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(filepath.Dir(filepath.Dir(matrix)), filepath.Join(dir, "configs")); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	got := benchRevision("configs/bench/strata-smoke.yaml")
	if !strings.HasPrefix(got, want) {
		t.Fatalf("revision %q, want %q (possibly with -dirty)", got, want)
	}
}

// TestBenchRevisionFromBinary: run from outside any checkout with a matrix
// outside it too, the revision is that of the checkout the strata binary
// was built into (bin/strata, here reached through a symbolic link).
func TestBenchRevisionFromBinary(t *testing.T) {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	want := strings.TrimSpace(string(out))
	inCheckout, err := filepath.Abs("../../go.mod") // stands in for bin/strata
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.yaml"), []byte("name: m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "strata")
	if err := os.Symlink(inCheckout, exe); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	if got := revisionOf("m.yaml", exe); !strings.HasPrefix(got, want) {
		t.Fatalf("revision %q, want %q (possibly with -dirty or -stale)", got, want)
	}
	if got := revisionOf("m.yaml", filepath.Join(dir, "m.yaml")); got != "unknown" {
		t.Fatalf("no checkout anywhere: %q, want unknown", got)
	}
}
