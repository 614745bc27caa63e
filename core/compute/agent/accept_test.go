package agent

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/cache/lfc"
)

// long reports whether the long acceptance runs are asked for.
func long() bool { return os.Getenv("STRATA_LONG_TESTS") == "1" }

func pgbench(t *testing.T, cfg Config, args ...string) string {
	t.Helper()
	cmd, err := pgtest.Command("pgbench", append([]string{"-h", cfg.Scratch + "/sock", "-p", strconv.Itoa(cfg.Port), "-U", "postgres"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pgbench %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func tps(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "tps = ") {
			return strings.TrimSpace(l)
		}
	}
	return "?"
}

// TestAgentPgbench is acceptance 2: pgbench on strata with the lfc and the
// shared-buffers strategies (equal memory), then pg_amcheck. By default the
// lfc strategy only, scale 5, 8 clients, 640 transactions; STRATA_LONG_TESTS=1: both
// strategies at scale 50 (the data does not fit in the 128 MiB budget), 8
// clients, 60 s.
func TestAgentPgbench(t *testing.T) {
	// 8 x 80 transactions by default (5 s made about 1,300 under the
	// default run's load).
	scale, run := "5", []string{"-t", "80"}
	strategies := []string{StrategyLFC} // TestAgentLifecycle's second compute runs shared-buffers
	if long() {
		scale, run = "50", []string{"-T", "60"}
		strategies = append(strategies, StrategySharedBuffers)
	}
	for _, strategy := range strategies {
		t.Run(strategy, func(t *testing.T) {
			r := startRig(t)
			cfg := r.agentConfig("pgbench-"+strategy, strategy)
			c := runAgent(t, cfg)
			t0 := time.Now()
			pgbench(t, cfg, "-i", "-q", "-s", scale, "postgres")
			t.Logf("%s: pgbench -i -s %s: %s", strategy, scale, time.Since(t0).Round(time.Millisecond))
			out := pgbench(t, cfg, append(append([]string{"-c", "8", "-j", "2"}, run...), "postgres")...)
			t.Logf("%s: pgbench -c 8 %s: %s", strategy, strings.Join(run, " "), tps(out))
			var buf strings.Builder
			PrintReport(&buf, c.a.Report())
			t.Logf("%s waits:\n%s", strategy, buf.String())
			amcheck(t, cfg)
		})
	}
}

// ledger inserts rows from a few clients and records the ids whose commit
// was acknowledged. Commits that fail (the server died) are not recorded.
type ledger struct {
	mu    sync.Mutex
	acked map[int]bool
	next  int
	stopc chan struct{}
	wg    sync.WaitGroup
}

func startLedger(url string, clients int, from int) *ledger {
	l := &ledger{acked: map[int]bool{}, next: from, stopc: make(chan struct{})}
	for i := 0; i < clients; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			var conn *pgx.Conn
			for {
				select {
				case <-l.stopc:
					if conn != nil {
						conn.Close(context.Background())
					}
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if conn == nil {
					c, err := pgx.Connect(ctx, url)
					if err != nil {
						cancel()
						time.Sleep(100 * time.Millisecond)
						continue
					}
					conn = c
				}
				l.mu.Lock()
				id := l.next
				l.next++
				l.mu.Unlock()
				_, err := conn.Exec(ctx, "INSERT INTO ledger VALUES ($1, repeat('x', 200))", id)
				cancel()
				if err != nil {
					conn.Close(context.Background())
					conn = nil
					continue
				}
				l.mu.Lock()
				l.acked[id] = true
				l.mu.Unlock()
			}
		}()
	}
	return l
}

func (l *ledger) stop() map[int]bool {
	close(l.stopc)
	l.wg.Wait()
	return l.acked
}

func (l *ledger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// TestAgentCrash is acceptance 3 for the postmaster: with
// full_page_writes=off, pgbench and a client-side ledger run while the
// postmaster is killed with SIGKILL at a random moment; the agent restarts
// Postgres from storage; every acknowledged ledger row is there and
// pg_amcheck is clean. 2 rounds by default, 10 with STRATA_LONG_TESTS=1.
func TestAgentCrash(t *testing.T) {
	rounds := 2
	if long() {
		rounds = 10
	}
	r := startRig(t)
	cfg := r.agentConfig("crash", StrategyLFC)
	cfg.FullPageWrites = false
	c := runAgent(t, cfg)
	exec(t, c.url, "CREATE TABLE ledger (id int PRIMARY KEY, pad text)")
	pgbench(t, cfg, "-i", "-q", "-s", "2", "postgres")
	acked := map[int]bool{}
	next := 1
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 6))
	for round := 1; round <= rounds; round++ {
		l := startLedger(c.url, 4, next)
		bench := make(chan struct{})
		go func() {
			defer close(bench)
			cmd, err := pgtest.Command("pgbench", "-h", cfg.Scratch+"/sock", "-p", strconv.Itoa(cfg.Port), "-U", "postgres", "-c", "4", "-T", "60", "postgres")
			if err == nil {
				cmd.Run() // fails when the server dies
			}
		}()
		wait := time.Duration(500+rng.IntN(4000)) * time.Millisecond
		time.Sleep(wait)
		before := c.a.Report().Restarts
		pid := c.a.PostmasterPID()
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		got := l.stop()
		<-bench
		for id := range got {
			acked[id] = true
		}
		next = l.next
		deadline := time.Now().Add(3 * time.Minute)
		for {
			rep := c.a.Report()
			if rep.Restarts > before && rep.State == "running" {
				t.Logf("round %d: killed after %s with %d rows acknowledged; restart took %s (term %d, E %s)", round, wait, len(got), rep.ColdStart, rep.Term, rep.DurableEnd)
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: not restarted: %+v", round, rep)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Every acknowledged row survived.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		conn, err := pgx.Connect(ctx, c.url)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := conn.Query(ctx, "SELECT id FROM ledger")
		if err != nil {
			t.Fatal(err)
		}
		have := map[int]bool{}
		for rows.Next() {
			var id int
			rows.Scan(&id)
			have[id] = true
		}
		rows.Close()
		conn.Close(ctx)
		cancel()
		for id := range acked {
			if !have[id] {
				t.Fatalf("round %d: acknowledged row %d lost (%d acknowledged, %d present)", round, id, len(acked), len(have))
			}
		}
		amcheck(t, cfg)
	}
	if len(acked) == 0 {
		t.Fatal("no commit was acknowledged")
	}
	t.Logf("%d rounds, %d acknowledged rows, all present", rounds, len(acked))
}

// TestLFCPartitions is acceptance 5 (STRATA_LONG_TESTS=1): a read-only
// pgbench (-S) at 16 clients on data that fits the LFC but not the 16 MB
// shared_buffers, with the LFC on one lock partition and on 64, twice in
// turn; the wait report shows lfc_lock and the throughput of each. The
// same timeline is served by one compute after the other. One partition
// must show more lfc_lock waits than 64 in each round.
func TestLFCPartitions(t *testing.T) {
	if !long() {
		t.Skip("STRATA_LONG_TESTS=1 runs the LFC partition comparison")
	}
	r := startRig(t)
	// The RAM tier copies a hit out after the lock is released; the disk
	// tier reads it with O_DIRECT while holding the partition's lock (as
	// Neon's LFC does), so one partition serializes the disk reads.
	for ti, tier := range []string{lfc.TierRAM, lfc.TierDisk} {
		var lockWaits [2]int64 // last round: one partition, 64
		for i, parts := range []int{1, 64, 1, 64} {
			cfg := r.agentConfig(tier+"-parts-"+strconv.Itoa(parts)+"-"+strconv.Itoa(i), StrategyLFC)
			cfg.Cache.MemoryBudget = 512 << 20
			cfg.Cache.LFC.Partitions = parts
			cfg.Cache.LFC.Tier = tier
			c := runAgent(t, cfg)
			if ti == 0 && i == 0 {
				pgbench(t, cfg, "-i", "-q", "-s", "10", "postgres")
			}
			// Warm the LFC: read every page of the table and its index through
			// the mount (pg_prewarm's read mode bypasses shared_buffers).
			exec(t, c.url, "CREATE EXTENSION IF NOT EXISTS pg_prewarm")
			query(t, c.url, "SELECT (pg_prewarm('pgbench_accounts', 'read') + pg_prewarm('pgbench_accounts_pkey', 'read'))::text")
			pgbench(t, cfg, "-S", "-c", "4", "-T", "5", "postgres")
			before := c.a.Report()
			out := pgbench(t, cfg, "-S", "-c", "16", "-j", "2", "-T", "30", "postgres")
			after := c.a.Report()
			var lock, read WaitStat
			for _, w := range after.Waits {
				for _, b := range before.Waits {
					if b.Name == w.Name {
						d := WaitStat{Name: w.Name, Count: w.Count - b.Count, Total: w.Total - b.Total}
						switch w.Name {
						case "lfc_lock":
							lock = d
						case "lfc_read":
							read = d
						}
					}
				}
			}
			hits, misses := after.CacheHits-before.CacheHits, after.CacheMisses-before.CacheMisses
			t.Logf("%s tier, round %d, partitions %d: %s, lfc_lock %d waits / %s, lfc_read %d / %s, LFC hits %d misses %d",
				tier, i/2+1, parts, tps(out), lock.Count, lock.Total.Round(time.Millisecond), read.Count, read.Total.Round(time.Millisecond), hits, misses)
			lockWaits[i%2] = lock.Count
			c.stop(t)
			if i%2 == 1 && lockWaits[0] <= lockWaits[1] {
				t.Errorf("%s tier, round %d: one LFC partition had %d lfc_lock waits, 64 partitions %d: the single lock's contention does not show", tier, i/2+1, lockWaits[0], lockWaits[1])
			}
		}
	}
}
