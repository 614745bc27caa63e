package netport

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func TestBlockBelowEphemeral(t *testing.T) {
	lo, hi := EphemeralRange()
	if lo <= 0 || hi < lo {
		t.Fatalf("range %d-%d", lo, hi)
	}
	for range 20 {
		base, err := Block(5)
		if err != nil {
			t.Fatal(err)
		}
		if base < Floor || base+5 > lo || Ephemeral(base) || Ephemeral(base+4) {
			t.Fatalf("block %d..%d: want it between %d and the ephemeral range at %d", base, base+4, Floor, lo)
		}
		for p := base; p < base+5; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("port %d of the block is not free: %v", p, err)
			}
			l.Close()
		}
	}
	if !Ephemeral(lo) || !Ephemeral(hi) || Ephemeral(lo-1) {
		t.Fatalf("Ephemeral disagrees with the range %d-%d", lo, hi)
	}
}

// TestBlockSkipsTakenPorts: a block never includes a port in use.
func TestBlockSkipsTakenPorts(t *testing.T) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 30 {
		base, err := Block(3)
		if err != nil {
			t.Fatal(err)
		}
		for p := base; p < base+3; p++ {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("Block returned %d..%d, but %d is taken: %v", base, base+2, p, err)
			}
			held = append(held, l) // keep them: the next blocks must avoid them
		}
	}
}

// TestClaim: a claimed port is refused to every other claim, in this
// process or another (util-linux flock(1) holding the same lock), until
// it is released or its holder is killed with -9.
func TestClaim(t *testing.T) {
	port, err := Block(1)
	if err != nil {
		t.Fatal(err)
	}
	release, ok := Claim(port)
	if !ok {
		t.Fatalf("port %d: a first claim was refused", port)
	}
	if _, ok := Claim(port); ok {
		t.Fatalf("port %d: claimed twice", port)
	}
	release()
	release, ok = Claim(port)
	if !ok {
		t.Fatalf("port %d: refused after its release", port)
	}
	release()

	if _, err := exec.LookPath("flock"); err != nil {
		t.Skip("no flock(1) to hold a claim from another process")
	}
	// flock and its sleep (which inherits the locked file) in a process
	// group of their own, killed together.
	cmd := exec.Command("flock", "-n", filepath.Join(os.TempDir(), "strata-test-ports", strconv.Itoa(port)), "sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); cmd.Wait() }()
	held := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r, ok := Claim(port); !ok {
			held = true
			break
		} else {
			r()
		}
	}
	if !held {
		t.Fatalf("port %d: claimed while another process held it", port)
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	// The sleep, killed with flock, may close the file a moment later.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if r, ok := Claim(port); ok {
			r()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("port %d: refused after its holder was killed", port)
		}
	}
}

// TestTake: a port is taken only when it is both unclaimed and free to
// listen on; a refused take holds nothing.
func TestTake(t *testing.T) {
	port, err := Block(1)
	if err != nil {
		t.Fatal(err)
	}
	release, ok := Take(port)
	if !ok {
		t.Fatalf("port %d: refused though free", port)
	}
	if _, ok := Take(port); ok {
		t.Fatalf("port %d: taken twice", port)
	}
	release()
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := Take(port); ok {
		t.Fatalf("port %d: taken while a server listens on it", port)
	}
	l.Close()
	release, ok = Take(port) // the refused take left no claim behind
	if !ok {
		t.Fatalf("port %d: refused once free again", port)
	}
	release()
}
