package safekeeper

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/safekeeper/archive"
	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestWALServiceFeedbackAndFetch: a pageserver-like consumer streams
// committed WAL over gRPC, its feedback lets the safekeepers delete archived
// and consumed WAL, and wal fetch reads segments back from safekeepers and
// from the archive.
func TestWALServiceFeedbackAndFetch(t *testing.T) {
	c := startCluster(t, func(cfg *Config) { cfg.Archive.KeepLocal = false })
	waitSync(t, c.srv, 3)
	if out, err := c.srv.Pgbench("-i", "-s", "2", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	end := testpg.FlushLSN(t, c.srv)
	n := c.nodes[0]
	testpg.WaitFor(t, 30*time.Second, "commit LSN", func() bool { return n.CommitLSN() >= end })
	start := n.Store().StartLSN()

	cl, err := server.Dial(c.cfgs[0].ListenAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cons, err := cl.Consume(ctx, "pageserver-1", start)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var got []byte
	pos := start
	for pos < end {
		ch, err := cons.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ch.Start != pos {
			t.Fatalf("chunk at %s, want %s", ch.Start, pos)
		}
		if ch.Start+pg.LSN(len(ch.Data)) > ch.CommitLSN {
			t.Fatalf("chunk %s+%d beyond commit LSN %s", ch.Start, len(ch.Data), ch.CommitLSN)
		}
		got = append(got, ch.Data...)
		pos += pg.LSN(len(ch.Data))
	}
	testpg.CompareBytes(t, c.srv, start, got, "streamed WAL")
	t.Logf("consumer received %s..%s (%d MiB), equal to pg_wal", start, pos, len(got)>>20)

	// Fetch the first segment before anything is removed: from the
	// safekeepers, and from the archive alone.
	seg := uint64(pg.WALSegmentSize)
	name := walstore.SegmentName(1, uint64(start)/seg, seg)
	want, err := os.ReadFile(filepath.Join(c.srv.DataDir, "pg_wal", name))
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := FetchSegment(ctx, FetchOptions{Safekeepers: []string{c.cfgs[1].ListenAddr}}, name, &buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatal("segment fetched from a safekeeper differs from pg_wal")
	}

	// A safekeeper that takes the connection and never answers, listed
	// first, costs the fetch its status timeout, not the segment.
	hung, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	go func() {
		for {
			conn, err := hung.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // held open, never read: a hung host
		}
	}()
	defer func(d time.Duration) { probeTimeout = d }(probeTimeout)
	probeTimeout = 500 * time.Millisecond
	buf.Reset()
	t0 := time.Now()
	if err := FetchSegment(ctx, FetchOptions{Safekeepers: []string{hung.Addr().String(), c.cfgs[1].ListenAddr}}, name, &buf); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); !bytes.Equal(buf.Bytes(), want) || took > 10*time.Second {
		t.Fatalf("fetch past a hung safekeeper: %d bytes equal to pg_wal: %v, took %s", buf.Len(), bytes.Equal(buf.Bytes(), want), took)
	} else {
		t.Logf("fetched past a hung safekeeper in %s", took.Round(time.Millisecond))
	}
	testpg.WaitFor(t, 30*time.Second, "archiving", func() bool { return n.Store().Control().ArchivedLSN > start })
	buf.Reset()
	if err := FetchSegment(ctx, FetchOptions{Archive: c.mem, Prefix: "wal"}, name, &buf); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatal("segment fetched from the archive differs from pg_wal")
	}
	// Another cluster's WAL in the same store (one bucket for two, or a
	// cluster made again over the objects of the one before): without its
	// system identifier the fetch says so rather than guess; with it, it
	// fetches this cluster's segment.
	sys := n.Store().Control().SystemID
	if err := c.mem.Put(ctx, archive.Key("wal", sys+1, name, false), bytes.NewReader(make([]byte, seg)), objectstore.PutOptions{Size: int64(seg)}); err != nil {
		t.Fatal(err)
	}
	buf.Reset()
	if err := FetchSegment(ctx, FetchOptions{Archive: c.mem, Prefix: "wal"}, name, &buf); !errors.Is(err, ErrAmbiguousArchive) || !strings.Contains(err.Error(), strconv.FormatUint(sys, 10)) {
		t.Fatalf("fetch from an archive of two clusters without a system identifier: %v, want ErrAmbiguousArchive naming both", err)
	}
	buf.Reset()
	if err := FetchSegment(ctx, FetchOptions{Archive: c.mem, Prefix: "wal", SystemID: sys}, name, &buf); err != nil || !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("fetch from an archive of two clusters with this one's system identifier: %v (same as pg_wal: %v)", err, bytes.Equal(buf.Bytes(), want))
	}
	// The last, partial segment: WAL up to the commit LSN, then zeros.
	last := walstore.SegmentName(1, uint64(end)/seg, seg)
	buf.Reset()
	if err := FetchSegment(ctx, FetchOptions{Safekeepers: []string{c.cfgs[2].ListenAddr}}, last, &buf); err != nil {
		t.Fatal(err)
	}
	commitOff := int(uint64(c.nodes[2].CommitLSN()) % seg)
	if buf.Len() != int(seg) || !bytes.Equal(buf.Bytes()[commitOff:], make([]byte, int(seg)-commitOff)) {
		t.Fatalf("partial segment: %d bytes, or not zero after the commit LSN", buf.Len())
	}
	testpg.CompareBytes(t, c.srv, pg.LSN(uint64(end)/seg*seg), buf.Bytes()[:commitOff], "fetched partial segment")
	if err := FetchSegment(ctx, FetchOptions{Safekeepers: []string{c.cfgs[2].ListenAddr}, Archive: c.mem, Prefix: "wal"}, "0000000100000000000000FF", &buf); !errors.Is(err, ErrSegmentNotFound) {
		t.Fatalf("fetch of a missing segment: %v", err)
	}

	// Nothing is removed before the consumer reports durability.
	time.Sleep(500 * time.Millisecond)
	if n.Store().StartLSN() != start {
		t.Fatalf("WAL removed before the consumer made it durable: start %s", n.Store().StartLSN())
	}
	if err := cons.Feedback(server.Feedback{Received: pos, Durable: pos, Uploaded: pos}); err != nil {
		t.Fatal(err)
	}
	testpg.WaitFor(t, 30*time.Second, "removal of archived and consumed WAL", func() bool {
		return n.Store().StartLSN() > start
	})
	ns := n.Store().StartLSN()
	if ns > n.Store().Control().ArchivedLSN || ns > pos {
		t.Fatalf("removed up to %s, beyond archived %s or durable %s", ns, n.Store().Control().ArchivedLSN, pos)
	}
	if _, err := os.Stat(filepath.Join(n.Store().WALDir(), name)); !os.IsNotExist(err) {
		t.Fatalf("segment %s still on disk: %v", name, err)
	}
	if _, err := n.Store().Read(start, 10); !errors.Is(err, walstore.ErrNotHeld) {
		t.Fatalf("read of removed WAL: %v", err)
	}
	t.Logf("local WAL removed below %s (archived %s, consumer durable %s)", ns, n.Store().Control().ArchivedLSN, pos)
}

// TestCorruptionDetectedAndRepaired: a flipped byte in a stored segment is
// found at start, the bad block is not served, and it is repaired from a
// peer; a flipped byte in the control file stops the safekeeper with a
// clear error.
func TestCorruptionDetectedAndRepaired(t *testing.T) {
	c := startCluster(t)
	waitSync(t, c.srv, 3)
	if out, err := c.srv.Pgbench("-i", "-s", "2", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	end := testpg.FlushLSN(t, c.srv)
	for _, n := range c.nodes {
		n := n
		testpg.WaitFor(t, 30*time.Second, "flush", func() bool { return n.Store().FlushLSN() >= end })
	}
	// Stop sk1 and flip one byte in its first segment.
	c.stopNode(0)
	start := c.nodes[0].Store().StartLSN()
	seg := uint64(pg.WALSegmentSize)
	path := filepath.Join(c.cfgs[0].DataDir, "pg_wal", walstore.SegmentName(1, uint64(start)/seg, seg))
	flipByte(t, path, 5<<20+123)
	bad := start + 5<<20

	n, err := New(c.cfgs[0], Deps{Logger: testLogger(t), Archive: c.mem})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Store().CorruptBlocks(); len(got) != 1 || got[0] != bad {
		t.Fatalf("corrupt blocks %v, want [%s]", got, bad)
	}
	if _, err := n.Store().Read(bad, 100); !errors.Is(err, walstore.ErrCorrupt) {
		t.Fatalf("read of the corrupt block: %v", err)
	}
	c.run(0, n)
	// Over gRPC the bad block is refused (DataLoss -> ErrCorrupt) until the
	// repair from a peer is done; then it is served and equals pg_wal.
	testpg.WaitFor(t, 30*time.Second, "repair from a peer", func() bool { return len(n.Store().CorruptBlocks()) == 0 })
	testpg.CompareWAL(t, c.srv, n.Store().WALDir(), start, n.Store().FlushLSN())
	cl, err := server.Dial(c.cfgs[0].ListenAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []byte
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	if err := cl.ReadWAL(rctx, bad, bad+walstore.BlockSize, server.BoundFlush, func(_ pg.LSN, d []byte) error {
		got = append(got, d...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	testpg.CompareBytes(t, c.srv, bad, got, "repaired block")

	// Control file: a flipped byte is refused at start with a clear error.
	c.stopNode(1)
	flipByte(t, filepath.Join(c.cfgs[1].DataDir, walstore.ControlFileName), 20)
	_, err = New(c.cfgs[1], Deps{Logger: testLogger(t)})
	if !errors.Is(err, walstore.ErrCorrupt) {
		t.Fatalf("start with a corrupt control file: %v", err)
	}
	t.Logf("corrupt control file: %v", err)
}

// TestServeRefusesCorruptBlock: with no peer to repair from, the gRPC
// service answers a read of a corrupt block with ErrCorrupt.
func TestServeRefusesCorruptBlock(t *testing.T) {
	dir := t.TempDir()
	st, err := walstore.Open(walstore.Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	st.Init(0x1000000, 7, 1)
	data := bytes.Repeat([]byte("walbytes"), 4096)
	st.Write(0x1000000, data)
	st.Flush()
	st.Close()
	flipByte(t, filepath.Join(dir, "pg_wal", walstore.SegmentName(1, 1, pg.WALSegmentSize)), 9000)
	cfg := DefaultConfig()
	cfg.DataDir, cfg.ListenAddr = dir, "127.0.0.1:0"
	n, err := New(cfg, Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	cl, err := server.Dial(n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	var got int
	err = cl.ReadWAL(rctx, 0x1000000, 0x1000000+pg.LSN(len(data)), server.BoundFlush, func(_ pg.LSN, d []byte) error {
		got += len(d)
		return nil
	})
	if !errors.Is(err, walstore.ErrCorrupt) {
		t.Fatalf("read across a corrupt block: %v", err)
	}
	if got > 8192 {
		t.Fatalf("served %d bytes, past the corrupt block at offset 8192", got)
	}
	t.Logf("refused: %v", err)
}

func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x10
	if _, err := f.WriteAt(b[:], off); err != nil {
		t.Fatal(err)
	}
}
