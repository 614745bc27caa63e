package safekeeper

import (
	"testing"
	"time"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/internal/smallfs"
	"github.com/stratadb/strata/sdk/pg"
)

// TestSafekeeperDiskFull runs one of the three safekeepers on a 40 MiB
// filesystem (a real tmpfs) under a stream of commits: when its disk fills
// up, commits go on with the other two, it says so (log, the disk_full
// gauge) and retries; once space is freed it catches up, and its WAL equals
// Postgres' byte for byte.
func TestSafekeeperDiskFull(t *testing.T) {
	small := smallfs.Mount(t, 40<<20)
	c := startCluster(t, func(cfg *Config) {
		if cfg.ID == "sk3" {
			cfg.DataDir = small
		}
	})
	waitSync(t, c.srv, 3)
	sk3 := c.nodes[2]
	series := func(name string) float64 {
		mfs, err := sk3.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == name {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatalf("no %s series", name)
		return 0
	}
	gauge := func() float64 { return series("strata_safekeeper_disk_full") }
	if gauge() != 0 {
		t.Fatal("disk_full is set before anything was written")
	}
	if free := series("strata_safekeeper_disk_free_bytes"); free <= 0 || free > 40<<20 {
		t.Fatalf("disk_free_bytes %g on a 40 MiB tmpfs", free)
	}

	// About 70 MB of WAL in commits of a few MB; each commit needs two
	// safekeepers, and sk3 runs out of space part way.
	c.srv.Exec("postgres", "CREATE TABLE filler (id int PRIMARY KEY, pad text)")
	const batches, rows = 20, 5000
	for b := 0; b < batches; b++ {
		c.srv.Exec("postgres", "SET statement_timeout = '60s'; INSERT INTO filler SELECT g, repeat(md5(g::text), 16) FROM generate_series("+
			itoa(b*rows+1)+", "+itoa((b+1)*rows)+") g")
	}
	end := testpg.FlushLSN(t, c.srv)
	testpg.WaitFor(t, 30*time.Second, "sk3 to report a full disk", func() bool { return gauge() == 1 })
	full := sk3.Store().FlushLSN()
	if full >= end {
		t.Fatalf("sk3 stored everything (%s of %s) on a 40 MiB disk", full, end)
	}
	for _, n := range c.nodes[:2] {
		if f := n.Store().FlushLSN(); f < end {
			t.Fatalf("a healthy safekeeper is at %s, Postgres at %s", f, end)
		}
	}
	t.Logf("sk3 full at %s, Postgres at %s; %d commits went on without it", full, end, batches)
	if got := c.srv.QueryString("postgres", "SELECT count(*)::text FROM filler"); got != itoa(batches*rows) {
		t.Fatalf("%s rows, want %d", got, batches*rows)
	}

	smallfs.Resize(t, small, 256<<20)
	testpg.WaitFor(t, 90*time.Second, "sk3 to catch up after space was freed", func() bool { return sk3.Store().FlushLSN() >= end })
	testpg.WaitFor(t, 10*time.Second, "disk_full to clear", func() bool { return gauge() == 0 })
	if free := series("strata_safekeeper_disk_free_bytes"); free < 64<<20 {
		t.Fatalf("disk_free_bytes %g after the tmpfs grew to 256 MiB", free)
	}
	start, flush := sk3.Store().StartLSN(), sk3.Store().FlushLSN()
	n := testpg.CompareWAL(t, c.srv, sk3.Store().WALDir(), start, flush)
	if pg.LSN(n) < end-start {
		t.Fatalf("compared %d bytes of sk3's WAL, want %d", n, end-start)
	}
	t.Logf("sk3 caught up: WAL %s..%s (%d MiB) equals pg_wal", start, flush, n>>20)
}
