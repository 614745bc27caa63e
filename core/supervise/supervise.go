// Package supervise runs a child process and starts it again when it
// crashes: the compute agent under `strata up`, so that a killed or
// crashed agent comes back without an operator.
//
// The rules:
//   - A child that exits with status 0, or with one of Options.Final (a
//     configuration error, say), is not restarted: Run returns.
//   - A child that dies otherwise (a signal, another status) is started
//     again after a backoff (Options.Backoff, doubling up to MaxBackoff;
//     back to Backoff after a run longer than MinUptime).
//   - A run is good when the child became ready (Options.Ready) or, without
//     Ready, ran at least MinUptime. A first run that was not good is not
//     retried: whatever is wrong (a port in use, storage ahead of the WAL)
//     is reported at once instead of being retried forever. Later,
//     MaxFailedStarts runs in a row that were not good end the supervision.
//   - When ctx ends (SIGTERM or SIGINT to the supervisor), the child gets
//     SIGTERM and Run waits for it: the child's own shutdown is bounded.
//   - The child gets SIGKILL when the supervisor dies (Linux parent-death
//     signal), so that killing the supervisor kills the child as before.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

// Options configure Run. Path is required.
type Options struct {
	// Path and Args are the child's program and arguments (without argv[0]).
	Path string
	Args []string
	// RestartArgs, when set, are the arguments of every start after the
	// first (a first start may do what a restart must not, such as an
	// import into a new cluster).
	RestartArgs []string
	// Env is the child's environment (nil: the supervisor's).
	Env []string
	// Stdout and Stderr receive the child's output (nil: discarded).
	Stdout, Stderr io.Writer
	// Name names the child in log lines (default: Path).
	Name string
	// Final are the exit statuses that are not crashes (0 always is).
	Final []int
	// MinUptime separates a failed start from a crash after running
	// (default 10 s), when Ready is nil.
	MinUptime time.Duration
	// Ready, when set, reports whether the child became ready (asked when
	// it exits); Reset, when set, runs before every start (to clear what
	// Ready looks at).
	Ready func() bool
	Reset func()
	// Backoff is the first delay before a restart (default 1 s); it doubles
	// after every short run up to MaxBackoff (default 30 s).
	Backoff, MaxBackoff time.Duration
	// MaxFailedStarts ends the supervision after this many short runs in a
	// row (default 5).
	MaxFailedStarts int
	Log             zerolog.Logger
	// Started, when set, is called with the PID of every child started.
	Started func(pid int)
	// Stuck, when set, is called once for a child that has been Dying for
	// StuckAfter (default 3 s): killed, but a thread of it waits in the
	// kernel for something that only the dying process itself could
	// answer, such as a FUSE server's request to its own mount. Stuck
	// should release that (abort the FUSE connection), so that the child
	// exits and is started again.
	Stuck      func(pid int)
	StuckAfter time.Duration
}

func (o *Options) defaults() {
	if o.Name == "" {
		o.Name = o.Path
	}
	if o.MinUptime <= 0 {
		o.MinUptime = 10 * time.Second
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.MaxBackoff < o.Backoff {
		o.MaxBackoff = max(30*time.Second, o.Backoff)
	}
	if o.MaxFailedStarts <= 0 {
		o.MaxFailedStarts = 5
	}
	if o.StuckAfter <= 0 {
		o.StuckAfter = 3 * time.Second
	}
}

// ExitError is a child's last exit that ended the supervision.
type ExitError struct {
	Name string
	// Code is the exit status, or -1 when a signal killed the child.
	Code   int
	Signal syscall.Signal
	// Restarts is how many times the child had been started again.
	Restarts int
	// Reason says why Run gave up.
	Reason string
}

func (e *ExitError) Error() string {
	how := fmt.Sprintf("exit status %d", e.Code)
	if e.Code < 0 {
		// Signal.String is a description ("killed"): add the number.
		how = fmt.Sprintf("%s (signal %d)", e.Signal, int(e.Signal))
	}
	return fmt.Sprintf("supervise: %s: %s (%s; %d restarts)", e.Name, how, e.Reason, e.Restarts)
}

// Run supervises the child until it exits for good (nil for status 0 or
// ctx's end, *ExitError otherwise) or it cannot be started (an error).
func Run(ctx context.Context, o Options) error {
	if o.Path == "" {
		return errors.New("supervise: Options.Path is required")
	}
	o.defaults()
	// The parent-death signal fires when the thread that started the child
	// exits: start every child from this one locked thread, which lives as
	// long as Run.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	backoff := o.Backoff
	short, restarts := 0, 0
	for {
		if o.Reset != nil {
			o.Reset()
		}
		args := o.Args
		if restarts > 0 && o.RestartArgs != nil {
			args = o.RestartArgs
		}
		cmd := exec.Command(o.Path, args...)
		cmd.Env = o.Env
		cmd.Stdout, cmd.Stderr = o.Stdout, o.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("supervise: start %s: %w", o.Name, err)
		}
		if o.Started != nil {
			o.Started(cmd.Process.Pid)
		}
		t0 := time.Now()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var werr error
		if stopped := o.wait(ctx, cmd.Process.Pid, exited, &werr); stopped {
			o.Log.Info().Str("child", o.Name).Err(werr).Msg("stopped on request")
			return nil
		}
		ran := time.Since(t0)
		code, sig := exitStatus(cmd.ProcessState)
		ee := &ExitError{Name: o.Name, Code: code, Signal: sig, Restarts: restarts}
		if code == 0 {
			o.Log.Info().Str("child", o.Name).Dur("ran", ran).Msg("exited with status 0: not restarted")
			return nil
		}
		if slices.Contains(o.Final, code) {
			ee.Reason = "a final status, not restarted"
			return ee
		}
		good := ran >= o.MinUptime
		failed := fmt.Sprintf("within %s", o.MinUptime)
		if o.Ready != nil {
			good, failed = o.Ready(), "before it was ready"
		}
		if !good {
			short++
			if restarts == 0 {
				ee.Reason = "the first start failed " + failed
				return ee
			}
			if short >= o.MaxFailedStarts {
				ee.Reason = fmt.Sprintf("%d starts in a row failed %s", short, failed)
				return ee
			}
		} else {
			short, backoff = 0, o.Backoff
		}
		o.Log.Warn().Str("child", o.Name).Int("pid", cmd.Process.Pid).Int("status", code).Str("signal", signalName(sig)).
			Dur("ran", ran).Dur("restart_in", backoff).Int("restart", restarts+1).Msg("child died: restarting it")
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		if !good {
			backoff = min(2*backoff, o.MaxBackoff)
		}
		restarts++
	}
}

// wait waits for the child to exit (its Wait result in *werr), sending
// it SIGTERM when ctx ends (stopped is then true), and calls o.Stuck once
// if it stays Dying for o.StuckAfter.
func (o *Options) wait(ctx context.Context, pid int, exited <-chan error, werr *error) (stopped bool) {
	tick := time.NewTicker(o.StuckAfter / 6)
	defer tick.Stop()
	done := ctx.Done()
	var dyingSince time.Time
	called := false
	for {
		select {
		case *werr = <-exited:
			return stopped
		case <-done:
			_ = syscall.Kill(pid, syscall.SIGTERM)
			stopped, done = true, nil
		case <-tick.C:
			if called || o.Stuck == nil {
				continue
			}
			if !Dying(pid) {
				dyingSince = time.Time{}
				continue
			}
			if dyingSince.IsZero() {
				dyingSince = time.Now()
			}
			if time.Since(dyingSince) >= o.StuckAfter {
				o.Log.Warn().Str("child", o.Name).Int("pid", pid).Dur("dying_for", time.Since(dyingSince)).
					Msg("child killed but not exiting (a thread waits in the kernel): releasing it")
				o.Stuck(pid)
				called = true
			}
		}
	}
}

// Dying reports whether a SIGKILL is pending in any thread of process
// pid: it was killed and has not finished exiting. For more than a moment
// that means a thread waits, uninterruptibly, on something that the dying
// process itself was to answer.
func Dying(pid int) bool {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/status", pid, t.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok || (k != "SigPnd" && k != "ShdPnd") {
				continue
			}
			if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<(syscall.SIGKILL-1)) != 0 {
				return true
			}
		}
	}
	return false
}

func exitStatus(ps *os.ProcessState) (int, syscall.Signal) {
	if ps == nil {
		return -1, 0
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal()
	}
	return ps.ExitCode(), 0
}

func signalName(s syscall.Signal) string {
	if s == 0 {
		return ""
	}
	return s.String()
}
