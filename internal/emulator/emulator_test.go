package emulator

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// recorder is a testing.TB that records Skip and Fatal instead of stopping.
type recorder struct {
	testing.TB
	calls []string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Skip(args ...any)          { r.calls = append(r.calls, "skip: "+fmt.Sprint(args...)) }
func (r *recorder) Fatal(args ...any)         { r.calls = append(r.calls, "fatal: "+fmt.Sprint(args...)) }
func (r *recorder) Fatalf(f string, a ...any) { r.Fatal(fmt.Sprintf(f, a...)) }

func TestFindBinaryMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	t.Setenv("GOBIN", "")
	t.Setenv("GOPATH", t.TempDir())
	t.Setenv("HOME", t.TempDir())
	for _, req := range []string{"", "1"} {
		t.Setenv(RequireEnv, req)
		r := &recorder{TB: t}
		FindBinary(r, "no-such-emulator")
		want := "skip: "
		if req == "1" {
			want = "fatal: "
		}
		if len(r.calls) == 0 || !strings.HasPrefix(r.calls[0], want) || !strings.Contains(r.calls[0], "scripts/emulators/install.sh") {
			t.Errorf("%s=%q: calls %q, want first a %q naming scripts/emulators/install.sh", RequireEnv, req, r.calls, want)
		}
	}
}

func TestFindBinaryInGOPATH(t *testing.T) {
	gopath := t.TempDir()
	bin := filepath.Join(gopath, "bin", "fake-emulator")
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", t.TempDir())
	t.Setenv("GOBIN", "")
	t.Setenv("GOPATH", gopath)
	if got := FindBinary(t, "fake-emulator"); got != bin {
		t.Fatalf("findBinary = %q, want %q", got, bin)
	}
}

// TestProcessStopped: StartProcess stops exactly the process it started
// when the test ends, and retries a process that exits at once.
func TestProcessStopped(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	var p *Process
	t.Run("inner", func(t *testing.T) {
		starts := 0
		_, p = StartProcess(t, sh, func(port int) []string {
			starts++
			if starts == 1 {
				return []string{"-c", "exit 3"} // dies before it is ready
			}
			return []string{"-c", "exec sleep 60"} // exec: no orphaned sleep holds the test output open for a minute
		}, func(int) error {
			if starts == 1 {
				return ErrNotReady
			}
			return nil
		})
		if starts != 2 {
			t.Fatalf("started %d times, want 2 (one retry)", starts)
		}
	})
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the process was not stopped at the end of the test")
	}
}
