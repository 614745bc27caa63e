package safekeeper

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper/archive"
	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/plugins/replication/pgstream"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/replication"
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

	// A WAL consumer that resumes below every safekeeper's WAL (a
	// pageserver replaced on an empty disk resumes where the object store's
	// layers end) gets the removed WAL from the archive, then the rest from
	// the safekeepers' own WAL, byte for byte.
	start := c.nodes[0].Store().StartLSN()
	for _, n := range c.nodes {
		start = max(start, n.Store().StartLSN())
	}
	t0 := time.Now()
	got := streamWAL(t, addrs, first, start+1<<20)
	took := time.Since(t0)
	testpg.CompareBytes(t, c.srv, first, got, "removed WAL streamed from the archive")
	t.Logf("streamed %d MB from %s (%d MB of it from the archive) in %s: %.0f MB/s",
		len(got)>>20, first, (start-first)>>20, took.Round(time.Millisecond), float64(len(got))/(1<<20)/took.Seconds())
	var read float64
	for _, n := range c.nodes {
		read += testutil.ToFloat64(n.m.fromArchive)
	}
	if read < float64(seg) {
		t.Fatalf("strata_safekeeper_archive_read_bytes_total: %v, want at least a segment", read)
	}
	// A segment missing from the archive fails the stream with an error
	// that says so, instead of a stream that waits forever.
	name = walstore.SegmentName(1, uint64(first)/seg+1, seg)
	if err := c.mem.Delete(context.Background(), archive.Key("wal", sys, name, false)); err != nil {
		t.Fatal(err)
	}
	src, err := pgstream.New(pgstream.Config{Safekeepers: addrs}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := src.Stream(ctx, "", pg.LSN(uint64(first)/seg*seg+seg))
	if err == nil {
		defer s.Close()
		_, err = s.Recv()
	}
	if !errors.Is(err, replication.ErrNotHeld) || !strings.Contains(err.Error(), "not in the archive") {
		t.Fatalf("stream from a segment missing from the archive: %v, want ErrNotHeld naming the archive", err)
	}
	// An object that is not the segment it is named for (here: the one
	// before it) is an error, not WAL that a consumer would read as its end.
	buf.Reset()
	if err := archive.Fetch(context.Background(), c.mem, "wal", sys, walstore.SegmentName(1, uint64(first)/seg, seg), int64(seg), &buf); err != nil {
		t.Fatal(err)
	}
	if err := c.mem.Put(context.Background(), archive.Key("wal", sys, name, false), bytes.NewReader(buf.Bytes()), objectstore.PutOptions{Size: int64(buf.Len())}); err != nil {
		t.Fatal(err)
	}
	s2, err := src.Stream(ctx, "", pg.LSN(uint64(first)/seg*seg+seg))
	if err == nil {
		defer s2.Close()
		_, err = s2.Recv()
	}
	if !errors.Is(err, replication.ErrCorrupt) || !strings.Contains(err.Error(), "first page is at") {
		t.Fatalf("stream from a misplaced archived segment: %v, want ErrCorrupt naming the page address", err)
	}
}

// streamWAL reads WAL [from, to) through a pg-stream source on addrs.
func streamWAL(t *testing.T, addrs []string, from, to pg.LSN) []byte {
	t.Helper()
	src, err := pgstream.New(pgstream.Config{Safekeepers: addrs}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := src.Stream(ctx, "", from)
	if err != nil {
		t.Fatalf("stream from %s: %v", from, err)
	}
	defer s.Close()
	var out []byte
	for from+pg.LSN(len(out)) < to {
		ch, err := s.Recv()
		if err != nil {
			t.Fatalf("stream at %s: %v", from+pg.LSN(len(out)), err)
		}
		if ch.Start != from+pg.LSN(len(out)) {
			t.Fatalf("chunk at %s, want %s", ch.Start, from+pg.LSN(len(out)))
		}
		out = append(out, ch.Data...)
	}
	return out[:to-from]
}

// TestConsumerProgressReachesEveryMember: a WAL consumer (a redo-mode
// pageserver) streams from one safekeeper, and before, only that one
// learned its progress: the other two, with no consumer of their own and
// no archive.retain, kept every WAL byte forever. Now each member learns
// the consumers' progress from its peers' status, and every member
// removes the archived WAL that the consumer made durable.
func TestConsumerProgressReachesEveryMember(t *testing.T) {
	c := startCluster(t, func(cfg *Config) { cfg.Archive.KeepLocal = false })
	waitSync(t, c.srv, 3)
	first := c.nodes[0].Store().StartLSN()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cl, cons := startConsumer(ctx, t, c.cfgs[0].ListenAddr, "pageserver-x", first)
	// The consumer reads to the end and reports it durable, to sk1 only.
	end := consumeFiller(t, c, cons, first)
	seg := uint64(pg.WALSegmentSize)
	want := pg.LSN(uint64(end) / seg * seg)
	for i, n := range c.nodes {
		n := n
		testpg.WaitFor(t, 60*time.Second, c.cfgs[i].ID+" to remove the WAL the consumer made durable", func() bool {
			return n.Store().StartLSN() >= want
		})
		fb, ok := n.ConsumerProgress("pageserver-x")
		if !ok || fb.Durable != end {
			t.Fatalf("%s knows the consumer at %+v (%v), want durable %s", c.cfgs[i].ID, fb, ok, end)
		}
		if st := n.Store(); st.StartLSN() > st.Control().ArchivedLSN || st.StartLSN() > end {
			t.Fatalf("%s removed up to %s: archived %s, consumer durable %s", c.cfgs[i].ID, st.StartLSN(), st.Control().ArchivedLSN, end)
		}
		t.Logf("%s: local WAL from %s (consumer durable %s)", c.cfgs[i].ID, n.Store().StartLSN(), end)
	}
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fb := st.Consumers["pageserver-x"]; fb.Durable != end || fb.Received != end {
		t.Fatalf("status reports the consumer at %+v, want %s", st.Consumers, end)
	}
}

// TestGoneConsumerForgotten: before, a safekeeper never forgot a WAL
// consumer, so a pageserver that went away for good (its timeline
// abandoned) kept every later WAL byte on every safekeeper's disk. Now a
// consumer that stays behind the commit LSN without progress for
// archive.consumer_expiry is forgotten by every member, and the live
// consumer's progress alone bounds the removal.
func TestGoneConsumerForgotten(t *testing.T) {
	const expiry = 3 * time.Second
	c := startCluster(t, func(cfg *Config) {
		cfg.Archive.KeepLocal = false
		cfg.Archive.ConsumerExpiry = expiry
	})
	waitSync(t, c.srv, 3)
	first := c.nodes[0].Store().StartLSN()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The old consumer reports once, to sk2, and goes away.
	_, old := startConsumer(ctx, t, c.cfgs[1].ListenAddr, "pageserver-old", first)
	if err := old.Feedback(server.Feedback{Received: first, Durable: first}); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.nodes {
		n := n
		testpg.WaitFor(t, 30*time.Second, c.cfgs[i].ID+" to learn of the old consumer", func() bool {
			_, ok := n.ConsumerProgress("pageserver-old")
			return ok
		})
	}
	old.Close()

	_, cur := startConsumer(ctx, t, c.cfgs[0].ListenAddr, "pageserver-new", first)
	end := consumeFiller(t, c, cur, first)
	seg := uint64(pg.WALSegmentSize)
	want := pg.LSN(uint64(end) / seg * seg)
	for i, n := range c.nodes {
		n := n
		testpg.WaitFor(t, 60*time.Second, c.cfgs[i].ID+" to forget the old consumer and remove the WAL the new one made durable", func() bool {
			return n.Store().StartLSN() >= want
		})
		if _, ok := n.ConsumerProgress("pageserver-old"); ok {
			t.Fatalf("%s removed WAL up to %s but still lists the old consumer", c.cfgs[i].ID, n.Store().StartLSN())
		}
		if fb, ok := n.ConsumerProgress("pageserver-new"); !ok || fb.Durable != end {
			t.Fatalf("%s knows the new consumer at %+v (%v), want durable %s", c.cfgs[i].ID, fb, ok, end)
		}
		if got := testutil.ToFloat64(n.m.consumersExpired); got != 1 {
			t.Fatalf("%s: strata_safekeeper_consumers_expired_total %v, want 1", c.cfgs[i].ID, got)
		}
		if st := n.Store(); st.StartLSN() > st.Control().ArchivedLSN || st.StartLSN() > end {
			t.Fatalf("%s removed up to %s: archived %s, consumer durable %s", c.cfgs[i].ID, st.StartLSN(), st.Control().ArchivedLSN, end)
		}
		t.Logf("%s: local WAL from %s (old consumer forgotten at %s, new one durable at %s)", c.cfgs[i].ID, n.Store().StartLSN(), first, end)
	}
	// The old consumer comes back from where it was: what it needs is
	// gone from the disks and streamed from the archive, byte for byte.
	var addrs []string
	for _, cfg := range c.cfgs {
		addrs = append(addrs, cfg.ListenAddr)
	}
	got := streamWAL(t, addrs, first, want+1<<20)
	testpg.CompareBytes(t, c.srv, first, got, "WAL of the forgotten consumer, streamed from the archive")
}

// startConsumer streams WAL from first as consumer id, from the
// safekeeper at addr, and returns the client and the stream; the test's
// cleanup closes both.
func startConsumer(ctx context.Context, t *testing.T, addr, id string, first pg.LSN) (*server.Client, *server.Consumer) {
	t.Helper()
	cl, err := server.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	cons, err := cl.Consume(ctx, id, first)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cons.Close() })
	return cl, cons
}

// consumeFiller writes about 55 MB of WAL, reads it from cons (which
// streams from first) and reports it received and durable; it returns
// the end of that WAL.
func consumeFiller(t *testing.T, c *cluster, cons *server.Consumer, first pg.LSN) pg.LSN {
	t.Helper()
	c.srv.Exec("postgres", "CREATE TABLE filler (id int PRIMARY KEY, pad text)")
	for b := 0; b < 10; b++ {
		c.srv.Exec("postgres", "INSERT INTO filler SELECT g, repeat(md5(g::text), 16) FROM generate_series("+
			itoa(b*5000+1)+", "+itoa((b+1)*5000)+") g")
	}
	end := testpg.FlushLSN(t, c.srv)
	for pos := first; pos < end; {
		ch, err := cons.Recv()
		if err != nil {
			t.Fatal(err)
		}
		pos = ch.Start + pg.LSN(len(ch.Data))
	}
	if err := cons.Feedback(server.Feedback{Received: end, Durable: end}); err != nil {
		t.Fatal(err)
	}
	return end
}
