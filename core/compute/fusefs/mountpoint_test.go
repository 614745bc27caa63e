package fusefs

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/supervise"
)

// stuckHelperEnv names the mountpoint for TestStuckOnOwnMountHelper, which
// runs only in the child process that TestMountpointCleanupFreesAStuckServer
// starts.
const stuckHelperEnv = "STRATA_FUSEFS_STUCK_HELPER_MNT"

// blockingRead is a Backend whose ReadFile of "stuck" never returns.
type blockingRead struct {
	Backend
	entered chan struct{}
}

func (b *blockingRead) ReadFile(ctx context.Context, path string, off int64, buf []byte) (int, error) {
	if path == "stuck" {
		close(b.entered)
		select {}
	}
	return b.Backend.ReadFile(ctx, path, off, buf)
}

// TestStuckOnOwnMountHelper is the child: it mounts a filesystem, reads a
// file of its own mount whose read never returns, says so on stdout and
// waits to be killed.
func TestStuckOnOwnMountHelper(t *testing.T) {
	mnt := os.Getenv(stuckHelperEnv)
	if mnt == "" {
		t.Skip("the child process of TestMountpointCleanupFreesAStuckServer")
	}
	ctx := context.Background()
	mem := NewMemory()
	if err := mem.CreateFile(ctx, "stuck", 0o600, 0); err != nil {
		t.Fatal(err)
	}
	if err := mem.WriteFile(ctx, "stuck", 0, []byte("never read"), 0); err != nil {
		t.Fatal(err)
	}
	be := &blockingRead{Backend: mem, entered: make(chan struct{})}
	if _, err := Mount(ctx, mnt, Options{Backend: be, WALScratch: filepath.Join(filepath.Dir(mnt), "wal"), Log: zerolog.Nop()}); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = os.ReadFile(filepath.Join(mnt, "stuck")) }()
	<-be.entered
	fmt.Println("blocked")
	select {}
}

// TestMountpointCleanupFreesAStuckServer: a FUSE server killed (kill -9)
// while one of its own threads waits on its own mount does not finish
// dying: it keeps its mount, its files and its ports. MountpointCleanup
// aborts the connection, and the process exits.
func TestMountpointCleanupFreesAStuckServer(t *testing.T) {
	needFUSE(t)
	root := t.TempDir()
	mnt := filepath.Join(root, "data")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestStuckOnOwnMountHelper$", "-test.v")
	cmd.Env = append(os.Environ(), stuckHelperEnv+"="+mnt)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{}) // closed once the helper was reaped
	var exitErr error
	t.Cleanup(func() {
		// Whatever failed: free the child, then the mountpoint.
		_ = cmd.Process.Kill()
		if err := MountpointCleanup(mnt); err != nil {
			t.Error(err)
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Errorf("the helper (pid %d) did not exit", cmd.Process.Pid)
		}
	})
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exitErr = cmd.Wait()
		close(exited)
	}()
	ready := time.After(30 * time.Second)
wait:
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatal("the helper exited before it blocked")
			}
			if l == "blocked" {
				break wait
			}
		case <-ready:
			t.Fatal("the helper did not block within 30 s")
		}
	}
	e, ok := mountAt(mnt)
	if !ok || !isFUSE(e.fstype) {
		t.Fatalf("no FUSE mount at %s: %+v", mnt, e)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		t.Fatalf("the killed helper exited by itself (%v): this kernel does not reproduce the hang", exitErr)
	case <-time.After(2 * time.Second):
	}
	if !supervise.Dying(cmd.Process.Pid) {
		t.Fatalf("the killed helper (pid %d) is alive but not dying", cmd.Process.Pid)
	}

	if err := MountpointCleanup(mnt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the killed helper still has not exited 10 s after MountpointCleanup")
	}
	if mounted(mnt) {
		t.Fatalf("%s is still mounted", mnt)
	}
	if !waitGone(e.dev, 5*time.Second) {
		t.Errorf("connection %s still listed in %s", e.dev, fusectlDir)
	}
	// The mountpoint is a plain folder again.
	if err := os.WriteFile(filepath.Join(mnt, "after"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestSupervisorReleasesAStuckChild: under core/supervise (what `strata up`
// runs the agent with), a FUSE server killed while it waits on its own
// mount is released by Options.Stuck and started again; the same while the
// supervisor stops (the child's SIGTERM is never handled here, as its main
// thread is the one waiting: it gets SIGKILL, as the cluster's stop does
// after its timeout).
func TestSupervisorReleasesAStuckChild(t *testing.T) {
	needFUSE(t)
	root := t.TempDir()
	mnt := filepath.Join(root, "data")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	blocked := make(chan struct{}, 4)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			if sc.Text() == "blocked" {
				blocked <- struct{}{}
			}
		}
	}()
	pids := make(chan int, 4)
	var stuck []int
	var mu sync.Mutex
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}) // closed when Run returned (runErr)
	var runErr error
	go func() {
		defer close(done)
		runErr = supervise.Run(ctx, supervise.Options{
			Path: os.Args[0], Args: []string{"-test.run=^TestStuckOnOwnMountHelper$", "-test.v"},
			Env:    append(os.Environ(), stuckHelperEnv+"="+mnt),
			Stdout: pw, Stderr: os.Stderr, Name: "stuck helper",
			MinUptime: 100 * time.Millisecond, Backoff: 100 * time.Millisecond,
			Started: func(pid int) { pids <- pid },
			Stuck: func(pid int) {
				mu.Lock()
				stuck = append(stuck, pid)
				mu.Unlock()
				if err := MountpointCleanup(mnt); err != nil {
					t.Error(err)
				}
			},
			StuckAfter: time.Second, Log: zerolog.Nop(),
		})
	}()
	t.Cleanup(func() {
		cancel()
		MountpointCleanup(mnt)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("the supervisor did not return")
		}
		pw.Close()
	})
	next := func(what string) int {
		t.Helper()
		select {
		case pid := <-pids:
			select {
			case <-blocked:
				return pid
			case <-time.After(30 * time.Second):
			}
		case <-time.After(30 * time.Second):
		}
		t.Fatalf("no %s child blocked on its own mount within 30 s", what)
		return 0
	}
	first := next("first")
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second := next("restarted")
	cancel()
	time.Sleep(200 * time.Millisecond)
	if err := syscall.Kill(second, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
		if runErr != nil {
			t.Fatalf("supervise: %v", runErr)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the supervisor did not stop its stuck child within 15 s")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(stuck) != 2 || stuck[0] != first || stuck[1] != second {
		t.Fatalf("Stuck called for %v, want [%d %d]", stuck, first, second)
	}
	if mounted(mnt) {
		t.Fatalf("%s is still mounted", mnt)
	}
}

// TestMountpointCleanupThroughALinkedParent: a mountpoint named through a
// link to its parent folder (a data folder under a linked /work or /tmp)
// is found and detached; mountinfo names only the resolved path. A tmpfs
// stands in for the mount: the lookup does not depend on its type.
func TestMountpointCleanupThroughALinkedParent(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	target := filepath.Join(t.TempDir(), "target")
	mnt := filepath.Join(target, "pgdata")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount a tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(mnt, syscall.MNT_DETACH) })

	viaLink := filepath.Join(link, "pgdata")
	if !mounted(viaLink) {
		t.Fatalf("the mount at %s is not found through %s", mnt, viaLink)
	}
	if err := MountpointCleanup(viaLink); err != nil {
		t.Fatal(err)
	}
	if mounted(mnt) {
		t.Fatalf("%s is still mounted after MountpointCleanup(%s)", mnt, viaLink)
	}
	// Nothing mounted: a no-op.
	if err := MountpointCleanup(viaLink); err != nil {
		t.Fatalf("second cleanup: %v", err)
	}
}
