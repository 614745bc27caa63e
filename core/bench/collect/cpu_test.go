package collect

import (
	"context"
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
