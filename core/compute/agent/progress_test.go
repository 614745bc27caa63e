package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/pg"
)

func TestSegmentInTitle(t *testing.T) {
	for _, c := range []struct {
		activity, want string
		ok             bool
	}{
		{"recovering 000000010000000000000003", "000000010000000000000003", true},
		{"recovering 0000000100000002000000FF waiting", "0000000100000002000000FF", true},
		{"waiting for 000000010000000000000003", "", false},
		{"recovering", "", false},
		{"recovering 00000001000000000000003", "", false},  // 23 digits
		{"recovering 000000010000000000000100", "", false}, // segment part past 16 MiB segments
		{"", "", false},
	} {
		got, ok := segmentInTitle(c.activity)
		if got != c.want || ok != c.ok {
			t.Errorf("segmentInTitle(%q) = %q, %v; want %q, %v", c.activity, got, ok, c.want, c.ok)
		}
	}
}

// titled starts a process whose command line is title (as Postgres sets
// its children's titles) and stops it at the end of the test.
func titled(t *testing.T, title string) int {
	t.Helper()
	cmd := osexec.Command("/bin/sleep", "60")
	cmd.Args[0] = title
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	// Until the exec is through, /proc shows the test binary's command
	// line.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline")
		if strings.HasPrefix(string(b), title+"\x00") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d: command line %q, want %q", cmd.Process.Pid, b, title)
		}
	}
	return cmd.Process.Pid
}

// TestReplayingSegment: the segment is read from the title of the startup
// process whose parent is the postmaster and whose tag is the cluster's,
// not from another cluster's or another process's title.
func TestReplayingSegment(t *testing.T) {
	titled(t, "postgres: strata-other: startup recovering 000000010000000000000009")
	titled(t, "postgres: strata-mine: checkpointer ")
	if name, ok := ReplayingSegment(os.Getpid(), "strata-mine"); ok {
		t.Fatalf("found %s with no startup process of this cluster", name)
	}
	titled(t, "postgres: strata-mine: startup recovering 00000001000000000000000C")
	name, ok := ReplayingSegment(os.Getpid(), "strata-mine")
	if !ok || name != "00000001000000000000000C" {
		t.Fatalf("ReplayingSegment = %q, %v; want 00000001000000000000000C", name, ok)
	}
	// A startup process of another postmaster (here: a parent that is not pm).
	if name, ok := ReplayingSegment(os.Getppid(), "strata-mine"); ok {
		t.Fatalf("found %s under another parent", name)
	}
}

// TestStartProgress: what the tracker reports and when it counts as
// progress.
func TestStartProgress(t *testing.T) {
	var tr progressTracker
	tr.update(func(p *Progress) { p.Step = "electing" })
	if tr.report() != nil || tr.idle() != 0 {
		t.Fatal("a tracker reports before its start began")
	}
	tr.begin()
	tr.update(func(p *Progress) { p.Step = "fetching WAL"; p.ReplayFrom, p.ReplayEnd = 0x1000028, 0x5800000 })
	tr.update(func(p *Progress) { p.FetchedSegments, p.FetchSegments = 2, 5 })
	if got := tr.report().String(); got != "fetching WAL from the safekeepers: 2 of 5 segments" {
		t.Errorf("fetching: %q", got)
	}
	time.Sleep(30 * time.Millisecond)
	tr.update(func(p *Progress) { p.FetchedSegments = 2 }) // no change
	if tr.idle() < 30*time.Millisecond {
		t.Errorf("an update that changes nothing counted as progress (idle %s)", tr.idle())
	}
	tr.update(func(p *Progress) { p.Step = "recovering" })
	if tr.idle() >= 30*time.Millisecond {
		t.Errorf("a new step did not count as progress (idle %s)", tr.idle())
	}
	if got := tr.report().String(); got != "postgres starting" {
		t.Errorf("recovering, no segment yet: %q", got)
	}
	tr.update(func(p *Progress) { p.Replaying, p.ReplayAt = "000000010000000000000003", 0x3000000 })
	if got := tr.report().String(); got != "postgres replaying WAL: segment 000000010000000000000003 (0/3000000, 44% of 0/1000028..0/5800000)" {
		t.Errorf("recovering: %q", got)
	}
	tr.update(func(p *Progress) { p.MountOps = 812 })
	if got := tr.report().String(); got != "postgres replaying WAL: segment 000000010000000000000003 (0/3000000, 44% of 0/1000028..0/5800000; 812 reads and writes on the mount)" {
		t.Errorf("recovering, with reads and writes: %q", got)
	}
	tr.end()
	if tr.report() != nil {
		t.Error("a tracker reports after its start ended")
	}
}

// TestWatchStartStalls: a start that keeps moving runs past StartTimeout;
// one that stops moving is cancelled with ErrNoProgress, naming its step.
func TestWatchStartStalls(t *testing.T) {
	var logs bytes.Buffer
	a := &Agent{cfg: Config{StartTimeout: 700 * time.Millisecond}, log: zerolog.New(&logs)}
	a.sp.begin()
	defer a.sp.end()
	a.setState("recovering")
	ctx, stop := context.WithCancelCause(context.Background())
	defer stop(nil)
	watched := make(chan struct{})
	go func() { defer close(watched); a.watchProgress(ctx, stop, a.cfg.StartTimeout) }()
	// Moving: a new segment every 200 ms for 2 s, nearly three times the
	// bound.
	for i := range 10 {
		a.sp.update(func(p *Progress) { p.ReplayAt = pg.LSN(i+1) << 24 })
		time.Sleep(200 * time.Millisecond)
		if ctx.Err() != nil {
			t.Fatalf("cancelled while moving: %v", context.Cause(ctx))
		}
	}
	// Stopped.
	select {
	case <-watched:
	case <-time.After(5 * time.Second):
		t.Fatal("a start without progress was not cancelled")
	}
	cause := context.Cause(ctx)
	if !errors.Is(cause, ErrNoProgress) || !strings.Contains(cause.Error(), "postgres starting") {
		t.Fatalf("cause %v; want ErrNoProgress naming the step", cause)
	}
}

// TestStartProgressOnCrashRecovery: after a kill -9 of the postmaster with
// many WAL segments since the last checkpoint, the restart reports its
// steps, the segments it fetched from the safekeepers and the segment
// crash recovery replays, and counts each as progress: with a bound on
// idleness well below what the whole restart takes, it still succeeds.
func TestStartProgressOnCrashRecovery(t *testing.T) {
	r := startRig(t)
	cfg := r.agentConfig("c1", StrategyLFC)
	cfg.Settings = map[string]string{"checkpoint_timeout": "'1h'", "max_wal_size": "'4GB'"}
	c := runAgent(t, cfg)
	exec(t, c.url, "CREATE TABLE w (id int, pad text)")
	exec(t, c.url, "CHECKPOINT")
	// About 90 MB of WAL: six segments to fetch and replay (the restart
	// takes about 4 s alone on two cores, more in a full test run, against
	// the 2 s bound on idleness below; 500,000 rows, eight segments, cost
	// 30 CPU-s, and 800,000 took 20 s in a full run).
	exec(t, c.url, "INSERT INTO w SELECT g, repeat('x', 200) FROM generate_series(1, 350000) g")
	lsn := query(t, c.url, "SELECT pg_current_wal_lsn()::text")

	// Sample the report through the restart.
	type seen struct {
		steps                []string
		fetchTotal           int
		fetchedAll           bool
		replaying            []string
		replayFrom, replayTo pg.LSN
	}
	var s seen
	stopSampling := sampleProgress(c.a, func(p *Progress) {
		if len(s.steps) == 0 || s.steps[len(s.steps)-1] != p.Step {
			s.steps = append(s.steps, p.Step)
		}
		if p.FetchSegments > 0 {
			s.fetchTotal = p.FetchSegments
			s.fetchedAll = s.fetchedAll || p.FetchedSegments == p.FetchSegments
		}
		if p.Replaying != "" && (len(s.replaying) == 0 || s.replaying[len(s.replaying)-1] != p.Replaying) {
			s.replaying = append(s.replaying, p.Replaying)
		}
		s.replayFrom, s.replayTo = p.ReplayFrom, p.ReplayEnd
	})
	// The bound on idleness: 2 s, below what the whole restart takes
	// on a slow machine (logged).
	c.a.mu.Lock()
	c.a.cfg.StartTimeout = 2 * time.Second
	c.a.mu.Unlock()
	pid := c.a.PostmasterPID()
	t0 := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for {
		rep := c.a.Report()
		if rep.Restarts >= 1 && rep.State == "running" && c.a.PostmasterPID() != pid {
			if rep.Restarts > 1 {
				t.Fatalf("the restart failed %d times", rep.Restarts-1)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not restarted: %+v", rep)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(t0)
	stopSampling()
	t.Logf("restart took %s; WAL to %s; steps %v; %d segments fetched; replayed %v from %s to %s", took, lsn, s.steps, s.fetchTotal, s.replaying, s.replayFrom, s.replayTo)
	for _, want := range []string{"fetching WAL", "recovering"} {
		if !slices.Contains(s.steps, want) {
			t.Errorf("the report never showed step %q (%v)", want, s.steps)
		}
	}
	if s.fetchTotal < 4 || !s.fetchedAll {
		t.Errorf("fetching WAL: %d segments to fetch, all fetched seen %v; want at least 4 and all", s.fetchTotal, s.fetchedAll)
	}
	if len(s.replaying) == 0 {
		t.Error("the report never named the segment crash recovery replays")
	}
	if s.replayFrom == 0 || s.replayTo <= s.replayFrom {
		t.Errorf("replay range %s..%s", s.replayFrom, s.replayTo)
	}
	if n := query(t, c.url, "SELECT count(*)::text FROM w"); n != "350000" {
		t.Fatalf("after the restart: %s rows", n)
	}
}

// TestStopProgress: a stop whose shutdown checkpoint writes many dirty
// pages reports them as progress, and is not cut short by a StopTimeout
// below its length: the bound is on idleness.
func TestStopProgress(t *testing.T) {
	r := startRig(t)
	cfg := r.agentConfig("c1", StrategySharedBuffers)
	cfg.Cache.MemoryBudget = 512 << 20 // 384 MB of shared_buffers
	cfg.Settings = map[string]string{"checkpoint_timeout": "'1h'", "max_wal_size": "'4GB'"}
	cfg.StopTimeout = time.Second
	c := runAgent(t, cfg)
	exec(t, c.url, "CREATE TABLE w (id int, pad text)")
	exec(t, c.url, "INSERT INTO w SELECT g, repeat('x', 200) FROM generate_series(1, 500000) g") // about 15,000 dirty buffers: a stop of seconds
	exec(t, c.url, "CREATE EXTENSION pg_buffercache")
	dirty := query(t, c.url, "SELECT count(*)::text FROM pg_buffercache WHERE isdirty")
	var ops uint64
	var steps []string
	stopSampling := sampleProgress(c.a, func(p *Progress) {
		if len(steps) == 0 || steps[len(steps)-1] != p.Step {
			steps = append(steps, p.Step)
		}
		ops = max(ops, p.MountOps)
	})
	t0 := time.Now()
	c.stop(t) // fails the test when the stop returns an error (Postgres killed)
	took := time.Since(t0)
	stopSampling()
	if t.Failed() {
		return
	}
	t.Logf("stop took %s with %s dirty buffers; steps %v; %d reads and writes on the mount seen", took, dirty, steps, ops)
	if !slices.Contains(steps, "stopping") || ops == 0 {
		t.Fatalf("the stop reported steps %v and %d reads and writes; want stopping, with the checkpoint's writes", steps, ops)
	}
}

// sampleProgress calls fn with the agent's progress report every 20 ms
// while a start or stop runs, until the returned stop is called.
func sampleProgress(a *Agent, fn func(*Progress)) (stop func()) {
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
			if p := a.Report().Progress; p != nil {
				fn(p)
			}
		}
	}()
	return func() {
		close(done)
		<-sampled
	}
}
