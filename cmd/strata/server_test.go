package main

import (
	"bytes"
	"os/exec"
	"strings"
	"sync"
	"testing"
)

// testServer is a strata server process a test started.
type testServer struct {
	cmd    *exec.Cmd
	done   chan struct{} // closed when the process has exited
	stderr bytes.Buffer
	once   sync.Once
}

// startServer starts bin with args in dir (the test's folder when "") and
// kills it, by its PID, when stop is called or the test ends.
func startServer(t *testing.T, bin, dir string, args ...string) *testServer {
	t.Helper()
	s := &testServer{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	s.cmd.Dir = dir
	s.cmd.Stderr = &s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	t.Cleanup(s.stop)
	return s
}

// stop kills the process unless it has exited, and waits for it.
func (s *testServer) stop() {
	s.once.Do(func() {
		select {
		case <-s.done:
		default:
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
}

// exited reports whether the process has exited.
func (s *testServer) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// metricValue returns the value of the unlabelled sample name on a
// Prometheus /metrics page, and whether the page has it.
func metricValue(page, name string) (string, bool) {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v, true
		}
	}
	return "", false
}
