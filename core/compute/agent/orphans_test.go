package agent

import (
	osexec "os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestReapGroup: only the processes of the group that run the given program
// are killed; another program in the same group, and the same program in
// another group, are left alone.
func TestReapGroup(t *testing.T) {
	sleep, err := osexec.LookPath("sleep")
	if err != nil {
		t.Skip(err)
	}
	sleep, _ = filepath.EvalSymlinks(sleep)
	// A group led by a shell that starts a sleep: both in the shell's group.
	sh := osexec.Command("sh", "-c", "sleep 60 & wait")
	sh.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-sh.Process.Pid, syscall.SIGKILL); sh.Wait() })
	other := osexec.Command(sleep, "60")
	other.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	var n int
	for n == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		n = reapGroup(sh.Process.Pid, sleep)
	}
	if n != 1 {
		t.Fatalf("reaped %d processes, want the one sleep in the group", n)
	}
	// The shell's wait returns once its sleep is gone.
	done := make(chan error, 1)
	go func() { done <- sh.Wait() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the shell is still waiting: its sleep was not killed")
	}
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the sleep of another group was killed: %v", err)
	}
	if reapGroup(1, sleep) != 0 {
		t.Fatal("group 1 must never be reaped")
	}
}
