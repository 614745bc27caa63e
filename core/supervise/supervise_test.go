package supervise

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// The test binary is its own child: with SUPERVISE_CHILD set, TestMain
// appends a line (its PID and arguments) to SUPERVISE_LOG and then does what SUPERVISE_CHILD says,
// reading the run number from the log's length.
//
//	"crash-then-0:N" runs N times killing itself (SIGKILL) after a little
//	                 more than childShort, then exits 0;
//	"exit:C"         exits with status C at once;
//	"crash-fast"     kills itself at once;
//	"long-once"      the first run kills itself after a little more than
//	                 childShort, later ones at once;
//	"wait"           waits for SIGTERM and exits 0.
func TestMain(m *testing.M) {
	if os.Getenv("SUPERVISE_PARENT") != "" {
		// A supervisor of a "wait" child, for TestChildDiesWithSupervisor.
		self, _ := os.Executable()
		env := append(os.Environ(), "SUPERVISE_CHILD=wait", "SUPERVISE_PARENT=")
		err := Run(context.Background(), Options{Path: self, Args: []string{"-test.run=^$"}, Env: env})
		if err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	mode := os.Getenv("SUPERVISE_CHILD")
	if mode == "" {
		os.Exit(m.Run())
	}
	logPath := os.Getenv("SUPERVISE_LOG")
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		os.Exit(99)
	}
	f.WriteString(strconv.Itoa(os.Getpid()) + " " + strings.Join(os.Args[1:], " ") + "\n")
	f.Close()
	b, _ := os.ReadFile(logPath)
	run := strings.Count(string(b), "\n")
	kind, arg, _ := strings.Cut(mode, ":")
	n, _ := strconv.Atoi(arg)
	switch kind {
	case "crash-then-0":
		if run <= n {
			time.Sleep(childShort + 100*time.Millisecond)
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		}
		os.Exit(0)
	case "exit":
		os.Exit(n)
	case "crash-fast":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case "long-once":
		if run == 1 {
			time.Sleep(childShort + 100*time.Millisecond)
		}
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
	case "wait":
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		<-c
		os.Exit(0)
	}
	time.Sleep(time.Hour)
}

// childShort is the tests' MinUptime. A "crash-fast" child must die well
// within it even on a loaded machine: starting this test binary took 141 ms
// once in CI (with a MinUptime of 100 ms, that crash counted as a good run).
const childShort = time.Second

func opts(t *testing.T, mode string) (Options, string, *[]int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "runs")
	var mu sync.Mutex
	var pids []int
	o := Options{
		Path: self, Args: []string{"-test.run=^$"},
		Env:       append(os.Environ(), "SUPERVISE_CHILD="+mode, "SUPERVISE_LOG="+logPath),
		Name:      "child",
		Final:     []int{2},
		MinUptime: childShort, Backoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond,
		MaxFailedStarts: 3,
		Log:             zerolog.New(zerolog.NewTestWriter(t)),
		Started: func(pid int) {
			mu.Lock()
			pids = append(pids, pid)
			mu.Unlock()
		},
	}
	return o, logPath, &pids
}

func runs(t *testing.T, logPath string) int {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "\n")
}

// TestRestartsAfterCrash: a child killed after running past MinUptime is
// started again, three times, and the fourth run's status 0 ends Run.
func TestRestartsAfterCrash(t *testing.T) {
	o, logPath, pids := opts(t, "crash-then-0:3")
	if err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	if n := runs(t, logPath); n != 4 || len(*pids) != 4 {
		t.Fatalf("%d runs, %d starts: want 4 (three crashes, then status 0)", n, len(*pids))
	}
}

// TestRestartArgs: a child started again gets RestartArgs, the first
// start Args.
func TestRestartArgs(t *testing.T) {
	o, logPath, _ := opts(t, "crash-then-0:2")
	o.Args = []string{"-test.run=^$", "--import-from", "/somewhere"}
	o.RestartArgs = []string{"-test.run=^$"}
	if err := Run(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d runs, want 3:\n%s", len(lines), b)
	}
	for i, l := range lines {
		if got, want := strings.Contains(l, "--import-from /somewhere"), i == 0; got != want {
			t.Errorf("run %d: %q: with the first start's arguments: %v, want %v", i+1, l, got, want)
		}
	}
}

// TestFinalStatusAndFailedFirstStart: a final status is not restarted; a
// first start that dies within MinUptime is reported, not retried.
func TestFinalStatusAndFailedFirstStart(t *testing.T) {
	o, logPath, _ := opts(t, "exit:2")
	var ee *ExitError
	if err := Run(context.Background(), o); !errors.As(err, &ee) || ee.Code != 2 || ee.Restarts != 0 {
		t.Fatalf("exit 2: %v", err)
	}
	if n := runs(t, logPath); n != 1 {
		t.Fatalf("exit 2 ran %d times", n)
	}
	o, logPath, _ = opts(t, "crash-fast")
	err := Run(context.Background(), o)
	if !errors.As(err, &ee) || ee.Code != -1 || ee.Signal != syscall.SIGKILL || !strings.Contains(err.Error(), "first start") {
		t.Fatalf("crash at once: %v", err)
	}
	if n := runs(t, logPath); n != 1 {
		t.Fatalf("a failed first start ran %d times", n)
	}
}

// TestGivesUpOnRepeatedShortRuns: after one long run, short runs in a row
// end the supervision at MaxFailedStarts.
func TestGivesUpOnRepeatedShortRuns(t *testing.T) {
	o, logPath, _ := opts(t, "long-once")
	err := Run(context.Background(), o)
	var ee *ExitError
	if !errors.As(err, &ee) || ee.Signal != syscall.SIGKILL || !strings.Contains(err.Error(), "3 starts in a row") {
		t.Fatalf("want an ExitError after 3 short runs, got %v", err)
	}
	if n := runs(t, logPath); n != 4 || ee.Restarts != 3 {
		t.Fatalf("%d runs, %d restarts: want one long run and three short ones", n, ee.Restarts)
	}
}

// TestStopForwardsSIGTERM: ctx's end sends SIGTERM to the child and Run
// returns once it exited.
func TestStopForwardsSIGTERM(t *testing.T) {
	o, logPath, pids := opts(t, "wait")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	for deadline := time.Now().Add(10 * time.Second); runs(t, logPath) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the child never started")
		}
	}
	time.Sleep(50 * time.Millisecond) // let it install its signal handler
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after ctx ended")
	}
	if err := syscall.Kill((*pids)[0], 0); err == nil {
		t.Fatalf("child %d still running", (*pids)[0])
	}
}

// TestChildDiesWithSupervisor: kill -9 of the supervisor kills its child
// (the parent-death signal), as killing the agent did before it had one.
func TestChildDiesWithSupervisor(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "runs")
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), "SUPERVISE_PARENT=1", "SUPERVISE_LOG="+logPath)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	for deadline := time.Now().Add(10 * time.Second); child == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatal("the child never started")
		}
		if b, err := os.ReadFile(logPath); err == nil {
			if f := strings.Fields(string(b)); len(f) > 0 {
				child, _ = strconv.Atoi(f[0])
			}
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		// Gone, or a zombie waiting for init to reap it.
		b, err := os.ReadFile("/proc/" + strconv.Itoa(child) + "/stat")
		if err != nil || strings.Contains(string(b), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("child %d still running 10 s after its supervisor was killed", child)
		}
	}
}

// TestReadyDecidesWhatIsAGoodRun: with Ready, a run is good when the child
// became ready, however short: the crashing children here are ready on
// their first two runs only, so the third run's crash is a failed start
// after two good runs, and the supervision ends after MaxFailedStarts.
func TestReadyDecidesWhatIsAGoodRun(t *testing.T) {
	o, logPath, _ := opts(t, "crash-fast")
	o.MinUptime = time.Hour
	resets := 0
	o.Reset = func() { resets++ }
	o.Ready = func() bool { return runs(t, logPath) <= 2 }
	err := Run(context.Background(), o)
	var ee *ExitError
	if !errors.As(err, &ee) || !strings.Contains(err.Error(), "3 starts in a row failed before it was ready") {
		t.Fatalf("got %v", err)
	}
	if n := runs(t, logPath); n != 5 || resets != 5 {
		t.Fatalf("%d runs, %d resets: want 2 ready runs and 3 failed ones, each after a reset", n, resets)
	}
}

// TestExitErrorNamesTheSignal: a child killed by a signal is reported by
// the signal's description and number ("killed (signal 9)"), not as
// "killed by killed".
func TestExitErrorNamesTheSignal(t *testing.T) {
	e := &ExitError{Name: "compute agent", Code: -1, Signal: syscall.SIGKILL, Reason: "the first start failed before it was ready"}
	want := "supervise: compute agent: killed (signal 9) (the first start failed before it was ready; 0 restarts)"
	if got := e.Error(); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	e = &ExitError{Name: "pageserver", Code: 2, Reason: "r", Restarts: 1}
	if got := e.Error(); !strings.Contains(got, "exit status 2") {
		t.Fatalf("got %q", got)
	}
}

// TestDying: a running child is not Dying, nor is a PID that does not
// exist; a child killed but stuck in the kernel is (that case needs FUSE:
// core/compute/fusefs TestMountpointCleanupFreesAStuckServer).
func TestDying(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if Dying(cmd.Process.Pid) {
		t.Fatalf("a sleeping child (pid %d) reads as dying", cmd.Process.Pid)
	}
	if Dying(os.Getpid()) {
		t.Fatal("the test process reads as dying")
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if Dying(cmd.Process.Pid) {
		t.Fatal("a reaped child reads as dying")
	}
}
