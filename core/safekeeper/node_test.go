package safekeeper

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

func longTests() bool { return os.Getenv("STRATA_LONG_TESTS") == "1" }

type cluster struct {
	t     testing.TB
	srv   *pgtest.Server
	nodes []*Node
	cfgs  []Config
	mem   *objectstore.Memory
	stop  []context.CancelFunc
	done  []chan struct{}
}

func testLogger(t testing.TB) zerolog.Logger {
	if os.Getenv("STRATA_TEST_LOG") == "1" {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	}
	return zerolog.Nop()
}

// startCluster starts Postgres with ANY 2 of three in-process safekeepers.
func startCluster(t testing.TB, tweak ...func(*Config)) *cluster {
	c := &cluster{t: t, mem: objectstore.NewMemory()}
	c.srv = testpg.Start(t, testpg.Options{Sync: "ANY 2 (sk1, sk2, sk3)"})
	var addrs []string
	for i := 0; i < 3; i++ {
		addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t)))
	}
	for i := 0; i < 3; i++ {
		cfg := DefaultConfig()
		cfg.ID = fmt.Sprintf("sk%d", i+1)
		cfg.DataDir = t.TempDir()
		cfg.ListenAddr = addrs[i]
		cfg.Postgres = testpg.ReplConnString(c.srv)
		cfg.StatusInterval = 200 * time.Millisecond
		cfg.ControlSyncInterval = 200 * time.Millisecond
		cfg.Archive = ArchiveConfig{Enabled: true, Prefix: "wal", PartialAfter: 500 * time.Millisecond, Interval: 200 * time.Millisecond, KeepLocal: true}
		for j, a := range addrs {
			if j != i {
				cfg.Peers = append(cfg.Peers, a)
			}
		}
		for _, f := range tweak {
			f(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
		c.nodes = append(c.nodes, nil)
		c.stop = append(c.stop, nil)
		c.done = append(c.done, nil)
		c.start(i)
	}
	t.Cleanup(c.close)
	return c
}

func (c *cluster) start(i int) {
	n, err := New(c.cfgs[i], Deps{Logger: testLogger(c.t).With().Str("sk", c.cfgs[i].ID).Logger(), Archive: c.mem})
	if err != nil {
		c.t.Fatal(err)
	}
	c.run(i, n)
}

// run runs node n as safekeeper i.
func (c *cluster) run(i int, n *Node) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	c.nodes[i], c.stop[i], c.done[i] = n, cancel, done
	go func() { defer close(done); n.Run(ctx) }()
}

// stopNode stops safekeeper i and waits for it.
func (c *cluster) stopNode(i int) {
	if c.stop[i] != nil {
		c.stop[i]()
		<-c.done[i]
		c.stop[i] = nil
	}
}

func (c *cluster) close() {
	for i := range c.stop {
		c.stopNode(i)
	}
}

// eachArchived calls fn with every segment object in the cluster's
// archive: its key, its segment number, whether it is a partial copy,
// and its bytes.
func (c *cluster) eachArchived(fn func(key string, no uint64, partial bool, data []byte) error) error {
	return c.mem.List(context.Background(), "wal/", func(oi objectstore.ObjectInfo) error {
		name := filepath.Base(oi.Key)
		_, no, err := walstore.ParseSegmentName(strings.TrimSuffix(name, ".partial"), uint64(pg.WALSegmentSize))
		if err != nil {
			return err
		}
		r, err := c.mem.Get(context.Background(), oi.Key)
		if err != nil {
			return err
		}
		defer r.Close()
		data, err := io.ReadAll(r)
		if err != nil {
			return err
		}
		return fn(oi.Key, no, strings.HasSuffix(name, ".partial"), data)
	})
}

// waitSync waits until Postgres sees n synchronous (quorum) standbys.
func waitSync(t testing.TB, srv *pgtest.Server, n int) {
	t.Helper()
	testpg.WaitFor(t, 60*time.Second, fmt.Sprintf("%d quorum standbys", n), func() bool {
		return srv.QueryString("postgres", "SELECT count(*)::text FROM pg_stat_replication WHERE sync_state = 'quorum'") == fmt.Sprint(n)
	})
}

func TestThreeSafekeepersPgbench(t *testing.T) {
	c := startCluster(t)
	waitSync(t, c.srv, 3)
	scale, dur := "2", "6"
	if longTests() {
		scale, dur = "10", "30"
	}
	if out, err := c.srv.Pgbench("-i", "-s", scale, "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	out, err := c.srv.Pgbench("-c", "8", "-j", "2", "-T", dur, "-P", "5", "postgres")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("pgbench:\n%s", tail(out, 6))
	end := testpg.FlushLSN(t, c.srv)
	for _, n := range c.nodes {
		n := n
		testpg.WaitFor(t, 60*time.Second, "safekeeper catch-up", func() bool { return n.Store().FlushLSN() >= end })
	}
	for i, n := range c.nodes {
		start, flush := n.Store().StartLSN(), n.Store().FlushLSN()
		bytes := testpg.CompareWAL(t, c.srv, n.Store().WALDir(), start, flush)
		t.Logf("%s: WAL %s..%s (%d MiB) equals pg_wal", c.cfgs[i].ID, start, flush, bytes>>20)
		if bytes < 16<<20 {
			t.Fatalf("%s compared only %d bytes", c.cfgs[i].ID, bytes)
		}
	}
	// Metrics: flush LSN gauge and the fsync histogram.
	for i, n := range c.nodes {
		mfs, err := n.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		var flushGauge float64
		var fsyncs uint64
		for _, mf := range mfs {
			switch mf.GetName() {
			case "strata_safekeeper_flush_lsn":
				flushGauge = mf.GetMetric()[0].GetGauge().GetValue()
			case "strata_safekeeper_fsync_seconds":
				fsyncs = mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
		if pg.LSN(flushGauge) < end || fsyncs == 0 {
			t.Fatalf("%s metrics: flush_lsn %v (want >= %d), fsync count %d", c.cfgs[i].ID, flushGauge, end, fsyncs)
		}
	}
	// Commit LSN: the quorum-durable position reaches the end.
	for _, n := range c.nodes {
		n := n
		testpg.WaitFor(t, 10*time.Second, "commit LSN", func() bool { return n.CommitLSN() >= end })
	}
	// Archive: every full segment below the end, and the partial last one.
	ctl := c.nodes[0].Store().Control()
	seg := uint64(pg.WALSegmentSize)
	testpg.WaitFor(t, 30*time.Second, "archiving", func() bool {
		for _, n := range c.nodes {
			if uint64(n.Store().Control().ArchivedLSN) < uint64(end)/seg*seg {
				return false
			}
		}
		return true
	})
	var full, partial int
	err = c.eachArchived(func(key string, no uint64, isPartial bool, data []byte) error {
		if !isPartial && len(data) != int(seg) {
			return fmt.Errorf("%s: %d bytes", key, len(data))
		}
		testpg.CompareBytes(t, c.srv, pg.LSN(no*seg), data, key)
		if isPartial {
			partial++
		} else {
			full++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := int(uint64(end)/seg - uint64(ctl.StartLSN)/seg); full != want {
		t.Fatalf("archived %d full segments, want %d", full, want)
	}
	t.Logf("archive: %d full segments and %d partial equal pg_wal", full, partial)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestFinalArchiveHasEveryCommit: safekeepers stopped together right after
// Postgres shut down put all of its WAL, its shutdown checkpoint with it,
// into the archive. Nothing waits for their commit LSN here, so they poll
// their peers for it once a second, and it lags the last WAL written; each
// asks its peers once more as it stops, and they answer until their own
// last archive step is done. A restore from the store at its latest moment
// relies on this.
func TestFinalArchiveHasEveryCommit(t *testing.T) {
	c := startCluster(t, func(cfg *Config) {
		cfg.Archive.PartialAfter = time.Hour // partial segments only as they stop
	})
	waitSync(t, c.srv, 3)
	if out, err := c.srv.Pgbench("-i", "-s", "1", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if out, err := c.srv.Pgbench("-c", "2", "-T", "2", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	// A clean shutdown waits until every safekeeper flushed the shutdown
	// checkpoint; then all three stop at once.
	c.srv.Stop()
	for i := range c.stop {
		c.stop[i]()
	}
	var flushes []pg.LSN
	for i := range c.nodes {
		<-c.done[i]
		c.stop[i] = nil
		flushes = append(flushes, c.nodes[i].Store().FlushLSN())
	}
	end := slices.Max(flushes)
	if slices.Min(flushes) != end {
		t.Fatalf("safekeepers stopped at different flush LSNs %v after a clean shutdown", flushes)
	}

	seg := uint64(pg.WALSegmentSize)
	var archived pg.LSN
	err := c.eachArchived(func(key string, no uint64, _ bool, data []byte) error {
		testpg.CompareBytes(t, c.srv, pg.LSN(no*seg), data, key)
		archived = max(archived, pg.LSN(no*seg)+pg.LSN(len(data)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if archived != end {
		t.Fatalf("the archive ends at %s, the WAL at %s: %d bytes of it are missing", archived, end, end-archived)
	}
	t.Logf("the archive holds the WAL to its end, %s", end)
}
