package e2e

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/core/pageserver/sklink"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// commitLag measures, per commit, how long after Postgres acknowledged it
// (two of the three safekeepers flushed it) the link's commit LSN covers
// it: the latency the safekeeper link adds to a compute fsync that waits
// for a page written just before the commit.
//
// With stopAt >= 0, the third safekeeper is stopped before commit stopAt:
// Postgres and the link go on with the other two.
func commitLag(tb testing.TB, n int, fast time.Duration, waiting bool, stopAt int) []time.Duration {
	srv := pgtest.Start(tb, pgtest.Options{Conf: map[string]string{"synchronous_standby_names": syncConf, "autovacuum": "off"}})
	nodes := startSafekeeperNodes(tb, srv.Port)
	sks := []string{nodes[0].addr, nodes[1].addr, nodes[2].addr}
	c, err := sklink.NewCommit(sklink.Config{Safekeepers: sks, Timeline: tlID, FastPoll: fast}, testLog(tb), nil)
	if err != nil {
		tb.Fatal(err)
	}
	c.SetHooks(sklink.Hooks{Waiting: func() bool { return waiting }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; c.Close() }()
	conn, err := pgx.Connect(ctx, srv.ConnString("postgres"))
	if err != nil {
		tb.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE lag (v int)"); err != nil {
		tb.Fatal(err)
	}
	var lags []time.Duration
	for i := 0; i < n; i++ {
		if i == stopAt {
			nodes[2].stop()
		}
		if _, err := conn.Exec(ctx, "INSERT INTO lag VALUES (1)"); err != nil {
			tb.Fatal(err)
		}
		acked := time.Now()
		var s string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
			tb.Fatal(err)
		}
		l, _ := pg.ParseLSN(s)
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		err := c.Wait(wctx, l)
		wcancel()
		if err != nil {
			tb.Fatalf("commit LSN never reached %s: %v (peers %+v)", l, err, c.Peers())
		}
		lags = append(lags, time.Since(acked))
	}
	return lags
}

func sorted(d []time.Duration) []time.Duration {
	d = append([]time.Duration(nil), d...)
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d
}

func pct(d []time.Duration, p float64) time.Duration { return d[int(float64(len(d)-1)*p)] }

// TestCommitLSNLag is the quick form of BenchmarkCommitLSNLag: with
// versions waiting (fast polls), the commit LSN follows Postgres' acks
// within a few milliseconds, also after one of the three safekeepers
// stopped (the other two are still a quorum).
func TestCommitLSNLag(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	all := commitLag(t, 200, 2*time.Millisecond, true, 100)
	for _, h := range []struct {
		name string
		lags []time.Duration
	}{{"three safekeepers", all[:100]}, {"one safekeeper stopped", all[100:]}} {
		lags := sorted(h.lags)
		p50, p99 := pct(lags, 0.5), pct(lags, 0.99)
		t.Logf("commit LSN lag after Postgres' ack (sync ANY 2 of 3, fast poll 2ms), %s: p50 %v p99 %v max %v", h.name, p50, p99, lags[len(lags)-1])
		if p50 > 20*time.Millisecond {
			t.Errorf("%s: p50 lag %v: the fast poll does not work", h.name, p50)
		}
	}
}

// BenchmarkCommitLSNLag reports the lag percentiles (run with -benchtime
// 500x). STRATA_LONG_TESTS is not needed: benchmarks run only on request.
func BenchmarkCommitLSNLag(b *testing.B) {
	if err := pgtest.Available(); err != nil {
		b.Skip(err)
	}
	for _, c := range []struct {
		name    string
		fast    time.Duration
		waiting bool
	}{{"fast1ms", time.Millisecond, true}, {"fast2ms", 2 * time.Millisecond, true}, {"slow_kick", 2 * time.Millisecond, false}} {
		b.Run(c.name, func(b *testing.B) {
			lags := sorted(commitLag(b, b.N, c.fast, c.waiting, -1))
			b.ReportMetric(float64(pct(lags, 0.5).Microseconds()), "p50_us")
			b.ReportMetric(float64(pct(lags, 0.99).Microseconds()), "p99_us")
		})
	}
}
