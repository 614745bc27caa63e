package agent

import (
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pluginhost"
	"github.com/stratadb/strata/plugins/cache/lfc"
	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/cache/cachetest"
	"github.com/stratadb/strata/sdk/pg"
)

var (
	advisorBuild    sync.Once
	advisorBin      string
	advisorBuildErr error
	advisorBuildDir string
)

// advisorPlugin builds examples/cache-advisor once per test binary.
func advisorPlugin(t *testing.T) string {
	t.Helper()
	advisorBuild.Do(func() {
		advisorBuildDir, advisorBuildErr = os.MkdirTemp("", "strata-advisor-test-")
		if advisorBuildErr != nil {
			return
		}
		advisorBin = filepath.Join(advisorBuildDir, "cache-advisor")
		cmd := osexec.Command("go", "build", "-ldflags=-s -w", "-o", advisorBin, "../../../examples/cache-advisor")
		if out, err := cmd.CombinedOutput(); err != nil {
			advisorBuildErr = errors.New(string(out))
		}
	})
	if advisorBuildErr != nil {
		t.Fatalf("building examples/cache-advisor: %v", advisorBuildErr)
	}
	return advisorBin
}

// hangMode, as the test binary's only argument, makes it a cache advisor
// plugin whose Advise never returns (a hung plugin).
const hangMode = "advisor-test-mode=hang"

func TestMain(m *testing.M) {
	if len(os.Args) == 2 && os.Args[1] == hangMode {
		cache.ServeAdvisorPlugin(func([]byte, zerolog.Logger) (cache.Advisor, error) { return hung{}, nil })
		return
	}
	code := m.Run()
	if advisorBuildDir != "" {
		os.RemoveAll(advisorBuildDir)
	}
	os.Exit(code)
}

// waitFor polls cond until it holds or 20 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAdvisorPluginSizesTheLFC runs the example advisor as a real plugin
// process against a real LFC: a mostly empty LFC is shrunk, one that
// evicts is grown again, and after kill -9 of the plugin the next period
// launches it again and the advice goes on.
func TestAdvisorPluginSizesTheLFC(t *testing.T) {
	bin := advisorPlugin(t)
	sum, err := pluginhost.FileSHA256(bin)
	if err != nil {
		t.Fatal(err)
	}
	const budget = 8 << 20
	cfg := lfc.DefaultConfig()
	cfg.SizeBytes = budget
	l, err := lfc.New(cfg, lfc.Options{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h := newAdvisorHost(AdvisorConfig{Every: 50 * time.Millisecond, Plugin: pluginhost.Spec{
		Path: bin, SHA256: sum, ConfigJSON: []byte(`{"min_bytes": 1048576, "grow_step": 0.5, "shrink_after": 2}`),
	}}, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel))
	defer h.close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.run(ctx, l, budget, nil) }()
	defer func() { cancel(); <-done }()

	page := make([]byte, pg.BlockSize)
	put := func(from, n int) {
		for b := from; b < from+n; b++ {
			if err := l.Put(pg.PageKey{Spc: 1663, DB: 5, Rel: 16384, Block: uint32(b)}, page, pg.LSN(100+b)); err != nil {
				t.Fatal(err)
			}
		}
	}
	put(0, 10) // 80 KiB of 8 MiB: mostly empty
	waitFor(t, "the advisor shrinks the mostly empty LFC to its minimum", func() bool { return l.Stats().CapacityBytes == 1<<20 })

	h.mu.Lock()
	pid := h.proc.PID()
	h.mu.Unlock()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	put(10, 400) // 3.2 MiB into 1 MiB: evictions
	waitFor(t, "the advisor, launched again, grows the LFC that evicts", func() bool { return l.Stats().CapacityBytes > 1<<20 })
	h.mu.Lock()
	launches, newPID := h.launches, h.proc.PID()
	h.mu.Unlock()
	if launches != 2 || newPID == pid {
		t.Fatalf("launches %d, pid %d (killed %d): want a second process", launches, newPID, pid)
	}
	if s := h.status(); !strings.HasPrefix(s, "running (pid ") || !strings.Contains(s, "2 launches") {
		t.Fatalf("status %q", s)
	}
	if ok := testutil.ToFloat64(h.calls.WithLabelValues("ok")); ok < 2 {
		t.Fatalf("%v successful calls", ok)
	}
}

// TestAdvisorPluginBadConfig: a plugin that refuses its config leaves the
// LFC as it is and says why; a plugin with the wrong checksum is not run.
func TestAdvisorPluginBadConfig(t *testing.T) {
	bin := advisorPlugin(t)
	obs := cache.Observation{Stats: cache.Stats{UsedBytes: 1, CapacityBytes: 8 << 20}, BudgetBytes: 8 << 20}
	h := newAdvisorHost(AdvisorConfig{Every: time.Second, Plugin: pluginhost.Spec{Path: bin, ConfigJSON: []byte(`{"grow_step": 7}`)}}, zerolog.Nop())
	defer h.close()
	_, err := h.Advise(context.Background(), obs)
	if err == nil || !strings.Contains(err.Error(), "refused its config") || !strings.Contains(err.Error(), "grow_step") {
		t.Fatalf("bad config: %v", err)
	}
	if _, err := h.Advise(context.Background(), obs); err == nil || !strings.Contains(err.Error(), "next launch in") {
		t.Fatalf("right after a failed launch: %v, want a wait", err)
	}
	if s := h.status(); !strings.HasPrefix(s, "down: ") || !strings.Contains(s, "refused its config") {
		t.Fatalf("status %q", s)
	}
	h2 := newAdvisorHost(AdvisorConfig{Plugin: pluginhost.Spec{Path: bin, SHA256: strings.Repeat("0", 64)}}, zerolog.Nop())
	defer h2.close()
	if _, err := h2.Advise(context.Background(), obs); !errors.Is(err, pluginhost.ErrChecksum) {
		t.Fatalf("wrong checksum: %v", err)
	}
}

// TestAdvisorPluginAcceptance runs the advisor contract's suite against
// the example plugin through the process boundary, as the agent calls it.
func TestAdvisorPluginAcceptance(t *testing.T) {
	bin := advisorPlugin(t)
	cachetest.RunAdvisor(t, func(t *testing.T) cache.Advisor {
		h := newAdvisorHost(AdvisorConfig{Plugin: pluginhost.Spec{Path: bin}}, zerolog.Nop())
		t.Cleanup(h.close)
		return h
	})
}

type hung struct{}

func (hung) Advise(context.Context, cache.Observation) (cache.Advice, error) { select {} }

// TestAdvisorPluginHung: a plugin that stops answering costs each period
// no more than the call timeout, and after three calls in a row without an
// answer it is killed and launched again.
func TestAdvisorPluginHung(t *testing.T) {
	h := newAdvisorHost(AdvisorConfig{Every: time.Second, CallTimeout: 200 * time.Millisecond,
		Plugin: pluginhost.Spec{Path: os.Args[0], Args: []string{hangMode}}}, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	defer h.close()
	obs := cache.Observation{Stats: cache.Stats{CapacityBytes: 1 << 20}, BudgetBytes: 1 << 20}
	var pids []int
	for i := 0; i < 4; i++ {
		t0 := time.Now()
		_, err := h.Advise(context.Background(), obs)
		if err == nil || !strings.Contains(err.Error(), "no answer within 200ms") {
			t.Fatalf("call %d: %v, want a timeout", i, err)
		}
		if d := time.Since(t0); d > 10*time.Second {
			t.Fatalf("call %d took %s", i, d)
		}
		h.mu.Lock()
		if h.proc != nil {
			pids = append(pids, h.proc.PID())
		} else {
			pids = append(pids, 0)
		}
		h.mu.Unlock()
	}
	// Calls 1-2 keep the first process, call 3 kills it, call 4 runs on a
	// new one.
	if pids[0] == 0 || pids[1] != pids[0] || pids[2] != 0 || pids[3] == 0 || pids[3] == pids[0] {
		t.Fatalf("plugin pids after each call %v: want the same one twice, none after the third timeout, then a new one", pids)
	}
	if err := syscall.Kill(pids[0], 0); err == nil {
		t.Fatalf("the hung plugin (pid %d) is still running", pids[0])
	}
}
