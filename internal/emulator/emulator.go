// Package emulator starts object store emulators (versitygw, Azurite, ...)
// as subprocesses for tests: it finds the binary that
// scripts/emulators/install.sh installs, picks a free port on 127.0.0.1,
// waits until the emulator answers, and stops exactly the process it started
// when the test ends, even on failure. Tests only.
package emulator

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RequireEnv is the environment variable that turns a missing emulator from
// a skipped test into a failed one (CI sets it to 1).
const RequireEnv = "STRATA_REQUIRE_EMULATORS"

// FindBinary looks for an emulator command in PATH, $GOBIN, $GOPATH/bin and
// ~/go/bin (where scripts/emulators/install.sh puts it). When it is missing
// the test is skipped, or failed when STRATA_REQUIRE_EMULATORS=1.
func FindBinary(t testing.TB, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	var dirs []string
	if d := os.Getenv("GOBIN"); d != "" {
		dirs = append(dirs, d)
	}
	if d := os.Getenv("GOPATH"); d != "" {
		dirs = append(dirs, filepath.Join(filepath.SplitList(d)[0], "bin"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(h, "go", "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	msg := fmt.Sprintf("emulator %q not found in PATH, $GOBIN or $GOPATH/bin: run scripts/emulators/install.sh", name)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatal(msg + " (" + RequireEnv + "=1 makes this a failure)")
	}
	t.Skip(msg)
	return ""
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Process is one emulator subprocess that the test started.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{}
	out  *tailBuffer
}

// StartProcess starts bin with args(port) on a free port, waits until
// ready(port) succeeds, and stops exactly that process (SIGTERM, then
// SIGKILL after 5 s) when t ends. The child also gets SIGKILL if the test
// Process dies first. A start that exits early (a port taken in between)
// is retried on a new port.
func StartProcess(t testing.TB, bin string, args func(port int) []string, ready func(port int) error) (int, *Process) {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			t.Fatalf("finding a free port: %v", err)
		}
		p := &Process{done: make(chan struct{}), out: &tailBuffer{max: 64 << 10}}
		p.cmd = exec.Command(bin, args(port)...)
		p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", bin, err)
		}
		go func() { _ = p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() { p.stop(t) })
		if lastErr = p.waitReady(port, ready); lastErr == nil {
			return port, p
		}
		p.stop(t)
		t.Logf("%s did not start on port %d: %v\n%s", filepath.Base(bin), port, lastErr, p.out.String())
	}
	t.Fatalf("%s did not start: %v", bin, lastErr)
	return 0, nil
}

func (p *Process) waitReady(port int, ready func(int) error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-p.done:
			return fmt.Errorf("exited: %v", p.cmd.ProcessState)
		default:
		}
		err := ready(port)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not ready after 30 s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *Process) stop(t testing.TB) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if t.Failed() {
		t.Logf("emulator %s output (tail):\n%s", filepath.Base(p.cmd.Path), p.out.String())
	}
}

// DialReady succeeds once something accepts TCP connections on the port.
func DialReady(port int) error {
	c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Write(p)
	if extra := b.buf.Len() - b.max; extra > 0 {
		b.buf.Next(extra)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// ErrNotReady is what a readiness probe returns while the emulator is not
// answering yet; StartProcess keeps probing until it returns nil.
var ErrNotReady = errors.New("emulator: not ready")
