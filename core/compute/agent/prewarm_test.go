package agent

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/compute/prewarm"
	"github.com/stratadb/strata/sdk/objectstore"
)

// TestAgentPrewarm: a compute with the LFC saves its page list in the
// object store when it stops; a second compute on new, empty folders loads
// those pages into its LFC after it starts, so that its first scan of the
// table is served by the LFC, not by the pageserver. A damaged list is
// reported and the compute runs with a cold LFC. Then the same under
// shared-buffers (autoprewarm).
func TestAgentPrewarm(t *testing.T) {
	r := startRig(t)
	store := objectstore.NewMemory()
	cfg1 := r.agentConfig("p1", StrategyLFC)
	cfg1.Cache.Prewarm, cfg1.Archive = true, store
	c1 := runAgent(t, cfg1)
	exec(t, c1.url, "CREATE TABLE warm AS SELECT g AS id, repeat('x', 500) AS pad FROM generate_series(1, 20000) g")
	exec(t, c1.url, "CHECKPOINT") // the table's pages go through the mount, into the LFC
	pages, _ := strconv.Atoi(query(t, c1.url, "SELECT (pg_relation_size('warm') / 8192)::text"))
	c1.stop(t)
	saved := c1.a.Report().Prewarm.Saved
	if saved == "" {
		t.Fatal("the first compute saved no page list when it stopped")
	}
	keys, name, err := prewarm.Load(t.Context(), store, cfg1.Timeline)
	if err != nil || name != saved || len(keys) < pages {
		t.Fatalf("saved list %s: %d pages (the table has %d), %v", name, len(keys), pages, err)
	}

	cfg2 := r.agentConfig("p2", StrategyLFC)
	cfg2.Cache.Prewarm, cfg2.Archive = true, store
	c2 := runAgent(t, cfg2)
	var rep *PrewarmReport
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		rep = c2.a.Report().Prewarm
		if (rep.State != "pending" && rep.State != "loading") || time.Now().After(deadline) {
			break
		}
	}
	if rep.State != "done" || rep.List != saved || rep.Loaded < pages {
		t.Fatalf("prewarm of the second compute: %+v; want done, from %s, at least the table's %d pages", rep, saved, pages)
	}
	before := c2.a.Report()
	if got := query(t, c2.url, "SELECT count(*)::text FROM warm"); got != "20000" {
		t.Fatalf("count = %s", got)
	}
	after := c2.a.Report()
	hits, misses := after.CacheHits-before.CacheHits, after.CacheMisses-before.CacheMisses
	t.Logf("prewarm %+v; the scan of %d pages: %d LFC hits, %d misses", rep, pages, hits, misses)
	if hits < uint64(pages) || misses > uint64(pages)/20 {
		t.Errorf("the first scan after the prewarm: %d hits and %d misses for %d pages; want them served by the LFC", hits, misses, pages)
	}
	c2.stop(t)

	// A damaged newest list: the third compute says so and runs cold.
	if err := store.Put(t.Context(), prewarm.Prefix(cfg1.Timeline)+"99999999999999999999", strings.NewReader("not a list"), objectstore.PutOptions{Size: 10}); err != nil {
		t.Fatal(err)
	}
	cfg3 := r.agentConfig("p3", StrategyLFC)
	cfg3.Cache.Prewarm, cfg3.Archive = true, store
	c3 := runAgent(t, cfg3)
	if got := query(t, c3.url, "SELECT count(*)::text FROM warm"); got != "20000" {
		t.Fatalf("count = %s", got)
	}
	if rep := c3.a.Report().Prewarm; rep.State != "failed" || !strings.Contains(rep.Error, "corrupt") {
		t.Errorf("prewarm from a damaged list: %+v; want failed with the reason", rep)
	}
	// Its stop saves a good list, which replaces the damaged one.
	c3.stop(t)
	if keys, _, err := prewarm.Load(t.Context(), store, cfg1.Timeline); err != nil || len(keys) == 0 {
		t.Errorf("after the third compute stopped: %d pages, %v", len(keys), err)
	}

	autoprewarm(t, r, pages)
}

// autoprewarm (part of TestAgentPrewarm, on its rig and table): under
// shared-buffers, prewarm is Postgres' own autoprewarm. Its block list is
// a file of the data directory, stored like the others, so a compute on
// new, empty folders finds it and loads the table into shared_buffers
// without a query asking for it (with prewarm off, 33 of the 1,334 pages
// were there a minute after the start).
func autoprewarm(t *testing.T, r *rig, pages int) {
	cfg1 := r.agentConfig("a1", StrategySharedBuffers)
	cfg1.Cache.Prewarm = true
	c1 := runAgent(t, cfg1)
	exec(t, c1.url, "CREATE EXTENSION pg_buffercache")
	// The table is a twelfth of shared_buffers: a scan keeps it there.
	if got := query(t, c1.url, "SELECT count(*)::text FROM warm"); got != "20000" {
		t.Fatalf("count = %s", got)
	}
	inBuffers := "SELECT count(*)::text FROM pg_buffercache WHERE relfilenode = pg_relation_filenode('warm') AND reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database())"
	if n, _ := strconv.Atoi(query(t, c1.url, inBuffers)); n < pages*9/10 {
		t.Fatalf("the first shared-buffers compute holds %d of the table's %d pages in shared_buffers", n, pages)
	}
	if got := c1.a.Report().Prewarm; got == nil || got.State != "autoprewarm" {
		t.Errorf("report: %+v, want autoprewarm", got)
	}
	c1.stop(t) // autoprewarm writes autoprewarm.blocks as Postgres stops

	cfg2 := r.agentConfig("a2", StrategySharedBuffers)
	cfg2.Cache.Prewarm = true
	c2 := runAgent(t, cfg2)
	var n int
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if n, _ = strconv.Atoi(query(t, c2.url, inBuffers)); n >= pages*9/10 {
			break
		}
	}
	if n < pages*9/10 {
		t.Fatalf("the second shared-buffers compute holds %d of the table's %d pages in shared_buffers a minute after its start", n, pages)
	}
	t.Logf("autoprewarm loaded %d of the table's %d pages into the new compute's shared_buffers", n, pages)
}
