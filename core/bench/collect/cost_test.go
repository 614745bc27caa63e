package collect

import (
	"context"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stratadb/strata/internal/pgtest"
)

// TestSamplerCost measures what the wait sampler (every 10 ms) and the ping
// probe (every 100 ms) cost in CPU: this process's CPU time plus the CPU
// time of their two server backends, over a few seconds with 16 idle
// sessions to sample, as a share of the machine. It must stay under 5%
// (acceptance: samplers and probe cost under 5% of throughput on a
// CPU-bound server).
func TestSamplerCost(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	ctx := context.Background()
	for i := 0; i < 16; i++ {
		c, err := pgx.Connect(ctx, srv.ConnString("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close(ctx)
	}
	c, err := Start(ctx, Options{URL: srv.ConnString("postgres"), DB: "postgres", Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	mon, err := pgx.Connect(ctx, srv.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer mon.Close(ctx)
	var pids []int
	rows, err := mon.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name IN ('strata-bench-waits', 'strata-bench-ping')")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p int
		_ = rows.Scan(&p)
		pids = append(pids, p)
	}
	rows.Close()
	if len(pids) != 2 {
		t.Fatalf("sampler backends: %v", pids)
	}
	backendTicks := func() uint64 {
		var n uint64
		for _, p := range pids {
			st, _ := readProc(p)
			n += st.ticks
		}
		return n
	}
	selfCPU := func() time.Duration {
		var ru syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	const window = 4 * time.Second
	b0, s0, t0 := backendTicks(), selfCPU(), time.Now()
	time.Sleep(window)
	b1, s1, el := backendTicks(), selfCPU(), time.Since(t0)
	r, err := c.Stop(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const clk = 100 // USER_HZ on Linux
	backend := time.Duration(b1-b0) * time.Second / clk
	self := s1 - s0
	share := 100 * (backend + self).Seconds() / (el.Seconds() * float64(runtime.NumCPU()))
	rate := float64(r.WaitTicks) / r.Duration.Seconds()
	t.Logf("sampler cost over %v: bench process %v + backends %v = %.2f%% of %d cores; %.0f wait samples/s, %d pings",
		el.Round(time.Millisecond), self, backend, share, runtime.NumCPU(), rate, r.Ping.TotalCount())
	if rate < 20 {
		t.Fatalf("sampler ran only %.0f times per second", rate)
	}
	if share > 5 {
		t.Fatalf("samplers cost %.2f%% of the machine (limit 5%%)", share)
	}
}
