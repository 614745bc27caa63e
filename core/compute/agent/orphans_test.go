package agent

import (
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestReapOrphans: the processes that run the given program and carry the
// tag in their title, or "-D <mountpoint>" in their arguments, are killed;
// the same program with another tag or mountpoint, and another program with
// the tag, are left alone.
func TestReapOrphans(t *testing.T) {
	sleep, err := osexec.LookPath("sleep")
	if err != nil {
		t.Skip(err)
	}
	sleep, _ = filepath.EvalSymlinks(sleep)
	tail, err := osexec.LookPath("tail")
	if err != nil {
		t.Skip(err)
	}
	mnt := t.TempDir()
	tag := clusterTag(mnt)
	type proc struct {
		cmd  *osexec.Cmd
		done chan struct{}
	}
	// argv[0] is where Postgres writes its process title.
	start := func(path string, args ...string) proc {
		p := proc{&osexec.Cmd{Path: path, Args: args}, make(chan struct{})}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.cmd.Wait(); close(p.done) }()
		t.Cleanup(func() { p.cmd.Process.Kill(); <-p.done })
		return p
	}
	backend := start(sleep, "postgres: "+tag+": postgres postgres 127.0.0.1(5000) INSERT waiting", "60")
	otherTag := start(sleep, "postgres: "+clusterTag(mnt+"x")+": checkpointer", "60")
	otherProg := start(tail, "postgres: "+tag+": walwriter", "-f", "/dev/null")
	time.Sleep(100 * time.Millisecond) // let exec finish: /proc/pid/exe names the new program
	if n := reapOrphans(sleep, tag, mnt); n != 1 {
		t.Fatalf("reaped %d processes, want the one tagged backend", n)
	}
	select {
	case <-backend.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the tagged backend still runs")
	}
	for _, p := range []proc{otherTag, otherProg} {
		select {
		case <-p.done:
			t.Fatalf("%q was killed", p.cmd.Args[0])
		default:
		}
	}
	if !postmasterOn([]byte("/usr/lib/postgresql/15/bin/postgres\x00-D\x00"+mnt+"/\x00"), mnt) {
		t.Fatal("a postmaster on the mountpoint was not recognised")
	}
	if postmasterOn([]byte("/usr/lib/postgresql/15/bin/postgres\x00-D\x00"+mnt+"x\x00"), mnt) {
		t.Fatal("a postmaster on another mountpoint was recognised")
	}
	if clusterTag(mnt) != clusterTag(mnt+"/") || clusterTag(mnt) == clusterTag(mnt+"x") {
		t.Fatal("clusterTag must depend on the cleaned mountpoint only")
	}
}

// TestWaitLockHolder: a lock file naming a running process waits and then
// fails; one naming a zombie is removed; one naming no process is left to
// Postgres (which removes stale lock files itself).
func TestWaitLockHolder(t *testing.T) {
	dir := t.TempDir()
	lock := filepath.Join(dir, "postmaster.pid")
	write := func(pid int) {
		if err := os.WriteFile(lock, []byte(fmt.Sprintf("%d\n/pgdata\n", pid)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	live := osexec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { live.Process.Kill(); live.Wait() }()
	write(live.Process.Pid)
	if err := waitLockHolder(lock, 300*time.Millisecond); err == nil {
		t.Fatal("a lock file of a running process must be an error after the timeout")
	}
	// Killed and not yet waited for: a zombie.
	zombie := osexec.Command("sleep", "60")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	zombie.Process.Kill()
	for i := 0; i < 100 && procState(zombie.Process.Pid) != 'Z'; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	write(zombie.Process.Pid)
	if err := waitLockHolder(lock, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(lock); !os.IsNotExist(err) {
		t.Fatalf("the zombie's lock file is still there (%v)", err)
	}
	zombie.Wait()
	write(zombie.Process.Pid) // reaped: no such process
	if err := waitLockHolder(lock, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := waitLockHolder(filepath.Join(dir, "missing"), time.Second); err != nil {
		t.Fatal(err)
	}
}
