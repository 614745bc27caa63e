package cluster

import (
	"path/filepath"
	"testing"
	"time"
)

func TestStartAliveStop(t *testing.T) {
	p, err := startDetached("sleeper", "/bin/sleep", []string{"30"}, filepath.Join(t.TempDir(), "log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() {
		t.Fatal("not alive after start")
	}
	other := p
	other.StartTime++
	if other.Alive() {
		t.Fatal("a different start time must not count as alive (PID reuse guard)")
	}
	if err := p.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Alive() {
		t.Fatal("alive after stop")
	}
	if err := p.Stop(time.Second); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}

func TestStopEscalatesToKill(t *testing.T) {
	// A shell that ignores SIGTERM.
	p, err := startDetached("stubborn", "/bin/sh", []string{"-c", "trap '' TERM; sleep 30"}, filepath.Join(t.TempDir(), "log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := p.Stop(300 * time.Millisecond); err == nil {
		t.Fatal("want an error saying it was killed")
	}
	if p.Alive() {
		t.Fatal("still alive after kill")
	}
}
