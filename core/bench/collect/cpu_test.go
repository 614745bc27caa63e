package collect

import (
	"context"
	"math"
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

// TestTargetCPU: a spinning process counts as busy, a sleeping one as
// quiet.
func TestTargetCPU(t *testing.T) {
	spin := exec.Command("sh", "-c", "while :; do :; done")
	if err := spin.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { spin.Process.Kill(); spin.Wait() }()
	sleep := exec.Command("sleep", "30")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { sleep.Process.Kill(); sleep.Wait() }()
	ctx := context.Background()
	busy, err := TargetCPU(ctx, Who{PIDs: []int{spin.Process.Pid}}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	idle, err := TargetCPU(ctx, Who{PIDs: []int{sleep.Process.Pid}}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// A spinning process uses at most one of the machine's cores: with
	// nothing else running about that share, under load (the test runs
	// beside other packages' tests) less, but clearly more than nothing.
	if most := 100 / float64(runtime.NumCPU()); busy < 5 || busy > most*1.1+1 || idle > 1 {
		t.Fatalf("spinning process %.1f%% of the machine (want 5%% to %.0f%%), sleeping one %.1f%% (want under 1%%)", busy, most, idle)
	}
}

// TestCPUDeltaSteal: the hypervisor's steal is its own figure, apart from
// the processes' shares, and counts as busy (the guest had work to run).
func TestCPUDeltaSteal(t *testing.T) {
	a := cpuSnap{total: 1000, idle: 600, steal: 50, cores: 2, procs: map[int]procStat{
		7: {ppid: 1, comm: "postgres", ticks: 100},
	}}
	// 1,000 ticks later: 300 idle, 250 stolen, 400 for the postgres
	// process, 50 for no process this snapshot lists (the kernel).
	b := cpuSnap{total: 2000, idle: 900, steal: 300, cores: 2, procs: map[int]procStat{
		7: {ppid: 1, comm: "postgres", ticks: 500},
	}}
	c := cpuDelta(a, b, Who{})
	if c.Steal != 25 || c.Busy != 70 || c.Target != 40 || c.Other != 0 {
		t.Fatalf("steal %.1f%% busy %.1f%% target %.1f%% other %.1f%%, want 25, 70, 40, 0", c.Steal, c.Busy, c.Target, c.Other)
	}
	// A counter that went backwards (a snapshot read across a CPU
	// hot-unplug) gives no steal rather than a huge one.
	b.steal = 10
	if c := cpuDelta(a, b, Who{}); c.Steal != 0 {
		t.Fatalf("steal %.1f%% from a counter that went back", c.Steal)
	}
}

// TestReadCPUSteal: this machine's /proc/stat parses, and its steal share
// is a share.
func TestReadCPUSteal(t *testing.T) {
	a := readCPU()
	time.Sleep(200 * time.Millisecond)
	b := readCPU()
	if a.cores < 1 || b.total <= a.total || b.steal < a.steal || b.steal-a.steal > b.total-a.total {
		t.Fatalf("snapshots %+v then %+v", a, b)
	}
}

// TestCPUDeltaNames: without PIDs, processes of the target's names count
// as the target (a strata cluster reached by URL: postgres and strata),
// this program as the driver whatever its name, and the rest as other.
func TestCPUDeltaNames(t *testing.T) {
	self := os.Getpid()
	a := cpuSnap{total: 1000, idle: 1000, cores: 2, procs: map[int]procStat{
		7: {ppid: 1, comm: "postgres"}, 8: {ppid: 1, comm: "strata"}, 9: {ppid: 1, comm: "gzip"},
		self: {ppid: 1, comm: "strata"},
	}}
	b := cpuSnap{total: 2000, idle: 1000, cores: 2, procs: map[int]procStat{
		7: {ppid: 1, comm: "postgres", ticks: 300}, 8: {ppid: 1, comm: "strata", ticks: 200},
		9: {ppid: 1, comm: "gzip", ticks: 100}, self: {ppid: 1, comm: "strata", ticks: 50},
	}}
	c := cpuDelta(a, b, Who{})
	if c.Target != 30 || c.Other != 30 || c.Driver != 5 {
		t.Fatalf("default names: target %.0f%% other %.0f%% driver %.0f%%, want 30, 30, 5", c.Target, c.Other, c.Driver)
	}
	c = cpuDelta(a, b, Who{Names: []string{"postgres", "strata"}})
	if c.Target != 50 || c.Other != 10 || c.Driver != 5 {
		t.Fatalf("postgres and strata: target %.0f%% other %.0f%% driver %.0f%%, want 50, 10, 5", c.Target, c.Other, c.Driver)
	}
	// PIDs win over names.
	c = cpuDelta(a, b, Who{PIDs: []int{9}, Names: []string{"postgres"}})
	if c.Target != 10 || c.Other != 50 {
		t.Fatalf("PIDs and names: target %.0f%% other %.0f%%, want 10, 50", c.Target, c.Other)
	}
}

// TestCPUDeltaParts: the target's CPU splits by part, each process in the
// part of its nearest root: Postgres (a child of the compute agent) and
// its backends count as "postgres", the agent's own time as "agent"; a
// target process under no part's root counts in the target only.
func TestCPUDeltaParts(t *testing.T) {
	procs := func(agent, pm, backend, sk1, sk2, loose uint64) map[int]procStat {
		return map[int]procStat{
			10: {ppid: 1, comm: "strata", ticks: agent},
			11: {ppid: 10, comm: "postgres", ticks: pm},
			12: {ppid: 11, comm: "postgres", ticks: backend},
			20: {ppid: 1, comm: "strata", ticks: sk1},
			21: {ppid: 1, comm: "strata", ticks: sk2},
			30: {ppid: 1, comm: "helper", ticks: loose},
		}
	}
	a := cpuSnap{total: 1000, idle: 500, cores: 2, procs: procs(0, 0, 0, 0, 0, 0)}
	// 1,000 ticks later: the agent 50, the postmaster 20 and its backend
	// 300, the two safekeepers 100 and 80, a target process in no part 30.
	b := cpuSnap{total: 2000, idle: 1000, cores: 2, procs: procs(50, 20, 300, 100, 80, 30)}
	who := Who{PIDs: []int{10, 20, 21, 30}, Parts: map[string][]int{
		"agent": {10}, "postgres": {11}, "safekeepers": {20, 21}, "pageserver": {40},
	}}
	c := cpuDelta(a, b, who)
	want := map[string]float64{"agent": 5, "postgres": 32, "safekeepers": 18, "pageserver": 0}
	if len(c.Parts) != len(want) {
		t.Fatalf("parts %v, want %v", c.Parts, want)
	}
	for k, v := range want {
		if got, ok := c.Parts[k]; !ok || math.Abs(got-v) > 1e-9 {
			t.Fatalf("part %s = %.2f%% (present %v), want %.0f%%; all %v", k, got, ok, v, c.Parts)
		}
	}
	if math.Abs(c.Target-58) > 1e-9 {
		t.Fatalf("target %.2f%%, want 58%% (the parts and the loose process)", c.Target)
	}
	// Without parts there is no split.
	if c := cpuDelta(a, b, Who{PIDs: who.PIDs}); c.Parts != nil {
		t.Fatalf("parts %v without Who.Parts", c.Parts)
	}
}

// TestPGKind: Postgres 15's process titles, with and without a
// cluster_name, name the process's role.
func TestPGKind(t *testing.T) {
	for title, want := range map[string]string{
		"/usr/lib/postgresql/15/bin/postgres\x00-D\x00/data\x00":                                     PGBackground,
		"postgres: strata-451706e3: walwriter \x00\x00\x00":                                          PGBackground,
		"postgres: checkpointer ":                                                                    PGBackground,
		"postgres: strata-1: autoprewarm leader ":                                                    PGBackground,
		"postgres: logical replication launcher ":                                                    PGBackground,
		"postgres: autovacuum worker strata_bench_tpcc_w4":                                           PGBackground,
		"postgres: strata-451706e3: walsender strata_repl 127.0.0.1(34270) streaming 0/18D02690\x00": PGWalsenders,
		"postgres: walsender postgres [local] streaming 0/3000148":                                   PGWalsenders,
		"postgres: strata-451706e3: postgres strata_bench_tpcc_w4 127.0.0.1(34296) CHECKPOINT\x00":   PGBackends,
		"postgres: postgres postgres [local] idle":                                                   PGBackends,
		"postgres: bench tpcc db.example(40112) idle in transaction":                                 PGBackends,
	} {
		if got := PGKind(title); got != want {
			t.Errorf("PGKind(%q) = %s, want %s", title, got, want)
		}
	}
}

// TestCPUDeltaPGKinds: the Postgres part's CPU splits by role; Postgres
// processes outside that part (none here) and other programs do not count.
func TestCPUDeltaPGKinds(t *testing.T) {
	procs := func(agent, pm, backend, walsender, ckpt uint64) map[int]procStat {
		return map[int]procStat{
			10: {ppid: 1, comm: "strata", ticks: agent},
			11: {ppid: 10, comm: "postgres", ticks: pm, kind: PGBackground},
			12: {ppid: 11, comm: "postgres", ticks: backend, kind: PGBackends},
			13: {ppid: 11, comm: "postgres", ticks: walsender, kind: PGWalsenders},
			14: {ppid: 11, comm: "postgres", ticks: ckpt, kind: PGBackground},
		}
	}
	a := cpuSnap{total: 1000, idle: 500, cores: 2, procs: procs(0, 0, 0, 0, 0)}
	b := cpuSnap{total: 2000, idle: 1000, cores: 2, procs: procs(50, 20, 300, 70, 10)}
	c := cpuDelta(a, b, Who{PIDs: []int{10}, Parts: map[string][]int{"agent": {10}, "postgres": {11}}})
	want := map[string]float64{PGBackends: 30, PGWalsenders: 7, PGBackground: 3}
	for k, v := range want {
		if math.Abs(c.PGKinds[k]-v) > 1e-9 {
			t.Fatalf("kinds %v, want %v", c.PGKinds, want)
		}
	}
	if math.Abs(c.Parts["postgres"]-40) > 1e-9 {
		t.Fatalf("postgres part %.2f%%, want the kinds' sum 40%%", c.Parts["postgres"])
	}
	// Known by name only (a URL target), the Postgres processes split too.
	c = cpuDelta(a, b, Who{})
	if math.Abs(c.PGKinds[PGWalsenders]-7) > 1e-9 || math.Abs(c.PGKinds[PGBackends]-30) > 1e-9 {
		t.Fatalf("kinds by name %v", c.PGKinds)
	}
	// A target without Postgres has no split.
	if c := cpuDelta(a, b, Who{PIDs: []int{10}, Parts: map[string][]int{"agent": {10}}}); c.PGKinds != nil {
		t.Fatalf("kinds %v without a postgres part", c.PGKinds)
	}
}
