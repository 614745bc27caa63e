package safekeeper

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stratadb/strata/core/safekeeper/archive"
	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestWALRemovedWithoutConsumers: in writeback mode no consumer streams
// from the safekeepers, and before, they kept every WAL byte forever (5 GB
// each after a day of benchmarks filled a disk). Now each removes what is
// archived and more than archive.retain below its flush LSN; what it
// removed is in the archive, byte for byte.
func TestWALRemovedWithoutConsumers(t *testing.T) {
	const retain = 16 << 20
	c := startCluster(t, func(cfg *Config) {
		cfg.Archive.KeepLocal = false
		cfg.Archive.Retain = retain
	})
	waitSync(t, c.srv, 3)
	first := c.nodes[0].Store().StartLSN()
	c.srv.Exec("postgres", "CREATE TABLE filler (id int PRIMARY KEY, pad text)")
	for b := 0; b < 16; b++ { // about 90 MB of WAL
		c.srv.Exec("postgres", "INSERT INTO filler SELECT g, repeat(md5(g::text), 16) FROM generate_series("+
			itoa(b*5000+1)+", "+itoa((b+1)*5000)+") g")
	}
	end := testpg.FlushLSN(t, c.srv)
	seg := uint64(pg.WALSegmentSize)
	for i, n := range c.nodes {
		n := n
		testpg.WaitFor(t, 60*time.Second, c.cfgs[i].ID+" to remove archived WAL", func() bool {
			return uint64(n.Store().StartLSN()) >= (uint64(end)-retain)/seg*seg
		})
		st := n.Store()
		if st.StartLSN() > st.Control().ArchivedLSN {
			t.Fatalf("%s removed up to %s, archived only up to %s", c.cfgs[i].ID, st.StartLSN(), st.Control().ArchivedLSN)
		}
		if st.FlushLSN()-st.StartLSN() < retain {
			t.Fatalf("%s keeps %s..%s, less than the %d bytes it retains", c.cfgs[i].ID, st.StartLSN(), st.FlushLSN(), retain)
		}
		t.Logf("%s: local WAL %s..%s (removed from %s)", c.cfgs[i].ID, st.StartLSN(), st.FlushLSN(), first)
	}
	// The removed segments are in the archive and equal Postgres' WAL.
	sys := c.nodes[0].Store().Control().SystemID
	for no := uint64(first) / seg; no < uint64(c.nodes[0].Store().StartLSN())/seg; no++ {
		var buf bytes.Buffer
		name := walstore.SegmentName(1, no, seg)
		if err := archive.Fetch(context.Background(), c.mem, "wal", sys, name, int64(seg), &buf); err != nil {
			t.Fatalf("removed segment %s is not archived: %v", name, err)
		}
		testpg.CompareBytes(t, c.srv, pg.LSN(no*seg), buf.Bytes(), name)
	}
	// A reader asking the safekeepers first (restore_command, a starting
	// compute) gets a removed segment from the archive.
	var addrs []string
	for _, cfg := range c.cfgs {
		addrs = append(addrs, cfg.ListenAddr)
	}
	var buf bytes.Buffer
	name := walstore.SegmentName(1, uint64(first)/seg, seg)
	if err := FetchSegment(context.Background(), FetchOptions{Safekeepers: addrs, Archive: c.mem, Prefix: "wal"}, name, &buf); err != nil {
		t.Fatalf("fetch of removed segment %s: %v", name, err)
	}
	testpg.CompareBytes(t, c.srv, first, buf.Bytes(), "removed segment fetched through the safekeepers' fallback")
}
