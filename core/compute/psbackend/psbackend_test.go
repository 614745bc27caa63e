package psbackend_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/fusefs/backendtest"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	pb "github.com/stratadb/strata/core/pageserver/pageserverpb"
	"github.com/stratadb/strata/core/pageserver/server"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// harness runs a pageserver with its gRPC server on a free loopback port.
type harness struct {
	ps *pageserver.Pageserver
	g  *grpc.Server
	c  *client.Client

	mu    sync.Mutex
	calls map[string]int // gRPC calls the pageserver answered, by method
	sizes int            // fork sizes stored: RelOp calls plus the sizes in PutPages
	empty int            // pages PutPages carried without bytes (pages of zeros)

	failPuts atomic.Bool // PutPages fails (an injected error) while set
}

// count returns how many calls of the method (its last path element, e.g.
// "RelOp") the pageserver has answered.
func (h *harness) count(method string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls["/strata.pageserver.v1.PageService/"+method]
}

// total returns how many calls the pageserver has answered.
func (h *harness) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.calls {
		n += c
	}
	return n
}

// sizeWrites returns how many fork sizes the pageserver was sent (RelOp
// calls and the sizes that PutPages carried).
func (h *harness) sizeWrites() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sizes
}

func start(tb testing.TB, dir string, store objectstore.Store) *harness {
	tb.Helper()
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = dir
	cfg.WaitLSNTimeout = 2 * time.Second
	reg := prometheus.NewRegistry()
	ps, err := pageserver.New(context.Background(), cfg, pageserver.Deps{Log: zerolog.Nop(), Registry: reg, Store: store})
	if err != nil {
		tb.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{ps: ps, calls: map[string]int{}}
	countCalls := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if strings.HasSuffix(info.FullMethod, "/PutPages") && h.failPuts.Load() {
			return nil, status.Error(codes.Internal, "injected PutPages failure")
		}
		h.mu.Lock()
		h.calls[info.FullMethod]++
		switch r := req.(type) {
		case *pb.PutPagesRequest:
			h.sizes += len(r.Sizes)
			for _, p := range r.Pages {
				if len(p.Page) == 0 {
					h.empty++
				}
			}
		case *pb.RelOpRequest:
			h.sizes++
		}
		h.mu.Unlock()
		return next(ctx, req)
	}
	// Batches on the GetPages stream count as calls of "GetPages".
	countBatches := func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
		return next(srv, &countingStream{ServerStream: ss, h: h, method: info.FullMethod})
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(256<<20), grpc.UnaryInterceptor(countCalls), grpc.StreamInterceptor(countBatches))
	server.New(ps, zerolog.Nop(), reg).Register(g)
	go g.Serve(lis)
	c, err := client.Dial(lis.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	h.g, h.c = g, c
	tb.Cleanup(h.stop)
	return h
}

// startTimeline starts a pageserver on a fresh folder and memory store and
// creates the timeline tl on it.
func startTimeline(t *testing.T) *harness {
	t.Helper()
	h := start(t, t.TempDir(), objectstore.NewMemory())
	if _, err := h.c.CreateTimeline(context.Background(), tl); err != nil {
		t.Fatal(err)
	}
	return h
}

// bufferedRel starts a pageserver with the timeline tl, opens a Backend
// that buffers up to 1,000 page writes, and creates a fork on it at W w.
func bufferedRel(t *testing.T, w pg.LSN) (*harness, *psbackend.Backend, pg.RelTag) {
	t.Helper()
	h := startTimeline(t)
	be := open(t, h, psbackend.Options{StandaloneCommit: true, WriteBuffer: 1000})
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	if err := be.CreateRel(context.Background(), rel, w); err != nil {
		t.Fatal(err)
	}
	return h, be, rel
}

// writeBlocks writes blocks 0..n-1 of rel, block b holding byte b+1, at
// W = w0+b.
func writeBlocks(t *testing.T, be *psbackend.Backend, rel pg.RelTag, n uint32, w0 pg.LSN) {
	t.Helper()
	for blk := uint32(0); blk < n; blk++ {
		if err := be.WritePage(context.Background(), rel.Page(blk), page(byte(blk+1)), w0+pg.LSN(blk)); err != nil {
			t.Fatal(err)
		}
	}
}

// countingStream counts the messages a client sends on a stream.
type countingStream struct {
	grpc.ServerStream
	h      *harness
	method string
}

func (s *countingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil {
		s.h.mu.Lock()
		s.h.calls[s.method]++
		s.h.mu.Unlock()
	}
	return err
}

func (h *harness) stop() {
	if h.g == nil {
		return
	}
	h.c.Close()
	h.g.Stop()
	h.ps.Close()
	h.g = nil
}

var tl = pg.TimelineID{0xC0, 1}

func open(tb testing.TB, h *harness, opts psbackend.Options) *psbackend.Backend {
	tb.Helper()
	b, err := psbackend.Open(context.Background(), h.c, tl, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestBackendSuite(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) fusefs.Backend {
		h := start(t, t.TempDir(), objectstore.NewMemory())
		if _, err := h.c.CreateTimeline(context.Background(), tl); err != nil {
			t.Fatal(err)
		}
		return open(t, h, psbackend.Options{StandaloneCommit: true})
	})
}

func page(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }

// waitingSync starts a Backend without StandaloneCommit, writes a page at
// W 200 and starts Sync(200) in the background; the commit LSN stays at 0
// until the test moves it. It checks that the Sync waits.
func waitingSync(t *testing.T) (*harness, *psbackend.Backend, chan error) {
	t.Helper()
	ctx := context.Background()
	h := startTimeline(t)
	be := open(t, h, psbackend.Options{})
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	if err := be.CreateRel(ctx, rel, 100); err != nil {
		t.Fatal(err)
	}
	if err := be.WritePage(ctx, rel.Page(0), page(7), 200); err != nil {
		t.Fatal(err)
	}
	synced := make(chan error, 1)
	go func() { synced <- be.Sync(ctx, 200) }()
	select {
	case err := <-synced:
		t.Fatalf("Sync(200) returned (%v) before the commit LSN reached 200", err)
	case <-time.After(150 * time.Millisecond):
	}
	return h, be, synced
}

// TestCloseEndsSync: a Sync that waits for a commit LSN that will never
// come (Postgres died with WAL the safekeepers never got) returns ErrClosed
// once the Backend is closed, so that the fsync it answers, and the mount,
// do not stay blocked for good.
func TestCloseEndsSync(t *testing.T) {
	_, be, synced := waitingSync(t)
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-synced:
		if !errors.Is(err, psbackend.ErrClosed) {
			t.Fatalf("Sync after Close: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Sync still waiting 5 s after Close")
	}
}

// TestSyncWaitsForCommitLSN: without StandaloneCommit, Sync(w) returns only
// once someone (the safekeepers in a cluster; here the test) advances the
// commit LSN to w, and a write above the commit LSN is not durable.
func TestSyncWaitsForCommitLSN(t *testing.T) {
	ctx := context.Background()
	h, be, synced := waitingSync(t)
	if d := be.Durable(); d >= 200 {
		t.Fatalf("durable %s before the commit LSN moved", d)
	}
	if err := h.c.AdvanceCommitLSN(ctx, tl, 199); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-synced:
		t.Fatalf("Sync(200) returned (%v) at commit LSN 199", err)
	case <-time.After(50 * time.Millisecond):
	}
	if err := h.c.AdvanceCommitLSN(ctx, tl, 200); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-synced:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Sync(200) still waiting after the commit LSN reached 200")
	}
	// SyncTimeout bounds a Sync the commit LSN does not reach.
	bounded := open(t, h, psbackend.Options{SyncTimeout: 50 * time.Millisecond})
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384} // waitingSync's fork
	if err := bounded.WritePage(ctx, rel.Page(1), page(8), 300); err != nil {
		t.Fatal(err)
	}
	if err := bounded.Sync(ctx, 300); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Sync past the commit LSN with a timeout: %v", err)
	}
	if d := be.Durable(); d < 200 {
		t.Fatalf("durable %s after Sync(200)", d)
	}
}

// TestReopen: a new Backend (empty caches) on the same timeline, and one on
// a restarted pageserver, see the synced files, folders and pages.
func TestReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	store := objectstore.NewMemory()
	h := start(t, dir, store)
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	be := open(t, h, psbackend.Options{StandaloneCommit: true})
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	for _, d := range []string{"base", "base/5", "global"} {
		if err := be.Mkdir(ctx, d, 0o750, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.CreateFile(ctx, "global/pg_control", 0o600, 2); err != nil {
		t.Fatal(err)
	}
	if err := be.WriteFile(ctx, "global/pg_control", 0, []byte("control"), 3); err != nil {
		t.Fatal(err)
	}
	if err := be.CreateRel(ctx, rel, 4); err != nil {
		t.Fatal(err)
	}
	writeBlocks(t, be, rel, 10, 10)
	if err := be.Remove(ctx, "base/5", 30); err == nil {
		t.Fatal("removed a folder holding a relation")
	}
	if err := be.Sync(ctx, 30); err != nil {
		t.Fatal(err)
	}
	check := func(be *psbackend.Backend) {
		t.Helper()
		n, err := be.Nblocks(ctx, rel)
		if err != nil || n != 10 {
			t.Fatalf("nblocks %d, %v", n, err)
		}
		buf := make([]byte, pg.BlockSize)
		for blk := uint32(0); blk < 10; blk++ {
			if err := be.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, page(byte(blk+1))) {
				t.Fatalf("block %d: %v, %d", blk, err, buf[0])
			}
		}
		got, err := be.ReadFile(ctx, "global/pg_control", 0, buf)
		if err != nil || string(buf[:got]) != "control" {
			t.Fatalf("pg_control %q, %v", buf[:got], err)
		}
		list, _ := be.List(ctx)
		dirs := map[string]uint32{}
		for _, fi := range list {
			if fi.Dir {
				dirs[fi.Path] = fi.Mode
			}
		}
		if len(dirs) != 3 || dirs["base/5"] != 0o750 {
			t.Fatalf("folders %v", dirs)
		}
	}
	check(open(t, h, psbackend.Options{}))
	h.stop()
	h2 := start(t, dir, store)
	check(open(t, h2, psbackend.Options{}))
}

// TestWriteBuffer: buffered page writes read back at once, reach the
// pageserver (another Backend sees them) only once sent by Sync, and a
// truncation orders after the writes it cuts.
func TestWriteBuffer(t *testing.T) {
	ctx := context.Background()
	h, be, rel := bufferedRel(t, 1)
	writeBlocks(t, be, rel, 10, 10)
	buf := make([]byte, pg.BlockSize)
	if err := be.ReadPage(ctx, rel.Page(9), 0, buf); err != nil || !bytes.Equal(buf, page(10)) {
		t.Fatalf("buffered page: %v, %d", err, buf[0])
	}
	other := open(t, h, psbackend.Options{})
	if n, err := other.Nblocks(ctx, rel); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("another Backend sees the new fork (%d blocks, %v) before the buffer was sent", n, err)
	}
	if err := be.TruncateRel(ctx, rel, 5, 30); err != nil {
		t.Fatal(err)
	}
	if err := be.Sync(ctx, 30); err != nil {
		t.Fatal(err)
	}
	other = open(t, h, psbackend.Options{})
	if n, err := other.Nblocks(ctx, rel); err != nil || n != 5 {
		t.Fatalf("after truncate and Sync: %d blocks, %v", n, err)
	}
	for blk := uint32(0); blk < 5; blk++ {
		if err := other.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, page(byte(blk+1))) {
			t.Fatalf("block %d: %v, %d", blk, err, buf[0])
		}
	}
	// Re-extension over the cut part reads zeros, through the buffer and after.
	if err := be.WritePage(ctx, rel.Page(7), page(77), 40); err != nil {
		t.Fatal(err)
	}
	if err := be.ReadPage(ctx, rel.Page(6), 0, buf); err != nil || !bytes.Equal(buf, make([]byte, pg.BlockSize)) {
		t.Fatalf("hole block 6 (buffered): %v, %d", err, buf[0])
	}
	if err := be.Close(); err != nil {
		t.Fatal(err)
	}
	other = open(t, h, psbackend.Options{})
	if err := other.ReadPage(ctx, rel.Page(6), 0, buf); err != nil || !bytes.Equal(buf, make([]byte, pg.BlockSize)) {
		t.Fatalf("hole block 6 after Close: %v, %d", err, buf[0])
	}
	if err := other.ReadPage(ctx, rel.Page(7), 0, buf); err != nil || !bytes.Equal(buf, page(77)) {
		t.Fatalf("block 7 after Close: %v, %d", err, buf[0])
	}
}

// TestZeroPagesWithoutBytes: a page of zeros (Postgres extends a relation
// with one) goes to the pageserver without its 8 KiB, and reads as zeros
// from the write buffer, from the pageserver and from another Backend,
// over a block that had content too.
func TestZeroPagesWithoutBytes(t *testing.T) {
	ctx := context.Background()
	h, be, rel := bufferedRel(t, 1)
	writeBlocks(t, be, rel, 2, 10)
	if err := be.Sync(ctx, 20); err != nil {
		t.Fatal(err)
	}
	zeros := make([]byte, pg.BlockSize)
	// Block 1 is overwritten with zeros, block 2 extends the fork with
	// them, and block 4 leaves a hole at block 3.
	for _, blk := range []uint32{1, 2} {
		if err := be.WritePage(ctx, rel.Page(blk), zeros, 30); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.WritePage(ctx, rel.Page(4), page(5), 31); err != nil {
		t.Fatal(err)
	}
	expect := func(b *psbackend.Backend, what string) {
		t.Helper()
		buf := make([]byte, pg.BlockSize)
		for blk, want := range [][]byte{page(1), zeros, zeros, zeros, page(5)} {
			for i := range buf {
				buf[i] = 0xEE
			}
			if err := b.ReadPage(ctx, rel.Page(uint32(blk)), 0, buf); err != nil || !bytes.Equal(buf, want) {
				t.Fatalf("%s: block %d: %v, reads %d, want %d", what, blk, err, buf[0], want[0])
			}
		}
		if n, err := b.Nblocks(ctx, rel); err != nil || n != 5 {
			t.Fatalf("%s: %d blocks, %v; want 5", what, n, err)
		}
	}
	expect(be, "from the write buffer")
	h.mu.Lock()
	empty := h.empty
	h.mu.Unlock()
	if empty != 0 {
		t.Fatalf("%d pages sent before the buffer was", empty)
	}
	if err := be.Sync(ctx, 31); err != nil {
		t.Fatal(err)
	}
	expect(be, "from the pageserver")
	expect(open(t, h, psbackend.Options{}), "from another Backend")
	h.mu.Lock()
	empty = h.empty
	h.mu.Unlock()
	if empty != 3 {
		t.Fatalf("%d pages went without their bytes, want 3 (blocks 1, 2 and the hole)", empty)
	}
}

// TestBufferedSizeWithMixedW: a fork extended at W 300, 310 whose block 0
// is rewritten at W 800 before the buffer goes out must keep 2 blocks on
// the pageserver (its size version at 800 must not say 1).
func TestBufferedSizeWithMixedW(t *testing.T) {
	ctx := context.Background()
	h, be, rel := bufferedRel(t, 100)
	for _, wr := range []struct {
		blk uint32
		w   pg.LSN
		b   byte
	}{{0, 300, 1}, {1, 310, 2}, {0, 800, 3}} {
		if err := be.WritePage(ctx, rel.Page(wr.blk), page(wr.b), wr.w); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.Sync(ctx, 800); err != nil {
		t.Fatal(err)
	}
	other := open(t, h, psbackend.Options{})
	if n, err := other.Nblocks(ctx, rel); err != nil || n != 2 {
		t.Fatalf("pageserver size %d, %v; want 2", n, err)
	}
	buf := make([]byte, pg.BlockSize)
	for blk, want := range []byte{3, 2} {
		if err := other.ReadPage(ctx, rel.Page(uint32(blk)), 0, buf); err != nil || !bytes.Equal(buf, page(want)) {
			t.Fatalf("block %d: %v, %d", blk, err, buf[0])
		}
	}
}

// TestOverwritesRestateNoSize: batches that only overwrite pages below the
// fork's size on the pageserver (a checkpoint's writes) send no size
// change (each is a version to store there); a batch that
// extends the fork restates its size, and a fresh Backend sees every page.
func TestOverwritesRestateNoSize(t *testing.T) {
	ctx := context.Background()
	h := startTimeline(t)
	be := open(t, h, psbackend.Options{StandaloneCommit: true, WriteBuffer: 4})
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	if err := be.CreateRel(ctx, rel, 100); err != nil {
		t.Fatal(err)
	}
	w := pg.LSN(100)
	write := func(blk uint32, b byte) {
		t.Helper()
		w++
		if err := be.WritePage(ctx, rel.Page(blk), page(b), w); err != nil {
			t.Fatal(err)
		}
	}
	for blk := uint32(0); blk < 10; blk++ {
		write(blk, 1)
	}
	if err := be.Sync(ctx, w); err != nil {
		t.Fatal(err)
	}
	sizes := h.sizeWrites()
	if sizes < 1 {
		t.Fatalf("extending by 10 pages sent %d size changes", sizes)
	}
	for round := byte(2); round <= 3; round++ {
		for blk := uint32(0); blk < 10; blk++ {
			write(blk, round)
		}
	}
	if err := be.Sync(ctx, w); err != nil {
		t.Fatal(err)
	}
	if n := h.sizeWrites() - sizes; n != 0 {
		t.Fatalf("20 overwrites in batches sent %d size changes, want 0", n)
	}
	write(12, 4) // past the end: blocks 10 and 11 become zeros
	if err := be.Sync(ctx, w); err != nil {
		t.Fatal(err)
	}
	if h.sizeWrites() == sizes {
		t.Fatal("an extension sent no size change")
	}
	other := open(t, h, psbackend.Options{})
	if n, err := other.Nblocks(ctx, rel); err != nil || n != 13 {
		t.Fatalf("pageserver size %d, %v; want 13", n, err)
	}
	buf := make([]byte, pg.BlockSize)
	for blk := uint32(0); blk < 13; blk++ {
		want := page(3)
		switch {
		case blk == 12:
			want = page(4)
		case blk >= 10:
			want = make([]byte, pg.BlockSize)
		}
		if err := other.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, want) {
			t.Fatalf("block %d: %v, %d", blk, err, buf[0])
		}
	}
}

// TestCreateRelTravelsWithPages: creating forks costs no round trip; the
// next send stores them with the page writes in one PutPages (empty forks
// too, and a fork written meanwhile with its size), after which another
// Backend sees them; an unlink costs none either and drops one at the
// next send. A Backend that dies
// before any send leaves no trace of its new forks (Postgres' crash
// recovery creates them again from the WAL), but a file written after a
// create goes out after it.
func TestCreateRelTravelsWithPages(t *testing.T) {
	ctx := context.Background()
	h := startTimeline(t)
	be := open(t, h, psbackend.Options{StandaloneCommit: true, WriteBuffer: 1000})
	empty := []pg.RelTag{{Spc: 1663, DB: 5, Rel: 16384}, {Spc: 1663, DB: 5, Rel: 16384, Fork: pg.FSMFork}, {Spc: 1663, DB: 5, Rel: 16390}}
	full := pg.RelTag{Spc: 1663, DB: 5, Rel: 16387}
	calls := h.total()
	w := pg.LSN(100)
	for _, rel := range append(empty, full) {
		w += 10
		if err := be.CreateRel(ctx, rel, w); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.total() - calls; n != 0 {
		t.Fatalf("creating 4 forks made %d calls to the pageserver, want 0", n)
	}
	for _, rel := range append(empty, full) {
		if n, err := be.Nblocks(ctx, rel); err != nil || n != 0 {
			t.Fatalf("%s here: %d blocks, %v", rel, n, err)
		}
	}
	for blk := uint32(0); blk < 3; blk++ {
		w += 10
		if err := be.WritePage(ctx, full.Page(blk), page(byte(blk+1)), w); err != nil {
			t.Fatal(err)
		}
	}
	other := open(t, h, psbackend.Options{})
	for _, rel := range append(empty, full) {
		if _, err := other.Nblocks(ctx, rel); !errors.Is(err, fusefs.ErrNotFound) {
			t.Fatalf("another Backend sees %s before the send: %v", rel, err)
		}
	}
	puts, relops := h.count("PutPages"), h.count("RelOp")
	if err := be.Sync(ctx, w); err != nil {
		t.Fatal(err)
	}
	if n := h.count("PutPages") - puts; n != 1 {
		t.Fatalf("Sync sent %d PutPages, want 1", n)
	}
	if n := h.count("RelOp") - relops; n != 0 {
		t.Fatalf("Sync sent %d RelOp, want 0 (the sizes travel with the pages)", n)
	}
	other = open(t, h, psbackend.Options{})
	for _, rel := range empty {
		if n, err := other.Nblocks(ctx, rel); err != nil || n != 0 {
			t.Fatalf("after Sync, %s: %d blocks, %v; want an empty fork", rel, n, err)
		}
	}
	if n, err := other.Nblocks(ctx, full); err != nil || n != 3 {
		t.Fatalf("after Sync, %s: %d blocks, %v; want 3", full, n, err)
	}
	buf := make([]byte, pg.BlockSize)
	for blk := uint32(0); blk < 3; blk++ {
		if err := other.ReadPage(ctx, full.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, page(byte(blk+1))) {
			t.Fatalf("block %d: %v, %d", blk, err, buf[0])
		}
	}
	// Re-creating an existing fork resets it, with writes still buffered:
	// none of them shows, here or on the pageserver.
	for blk := uint32(0); blk < 2; blk++ {
		w += 10
		if err := be.WritePage(ctx, full.Page(blk), page(9), w); err != nil {
			t.Fatal(err)
		}
	}
	w += 10
	if err := be.CreateRel(ctx, full, w); err != nil {
		t.Fatal(err)
	}
	w += 10
	if err := be.WritePage(ctx, full.Page(1), page(42), w); err != nil {
		t.Fatal(err)
	}
	if err := be.ReadPage(ctx, full.Page(0), 0, buf); err != nil || !bytes.Equal(buf, make([]byte, pg.BlockSize)) {
		t.Fatalf("block 0 of the reset fork (a hole): %v, %d", err, buf[0])
	}
	if err := be.Sync(ctx, w); err != nil {
		t.Fatal(err)
	}
	other = open(t, h, psbackend.Options{})
	if n, err := other.Nblocks(ctx, full); err != nil || n != 2 {
		t.Fatalf("reset fork: %d blocks, %v; want 2", n, err)
	}
	for blk, want := range [][]byte{make([]byte, pg.BlockSize), page(42)} {
		if err := other.ReadPage(ctx, full.Page(uint32(blk)), 0, buf); err != nil || !bytes.Equal(buf, want) {
			t.Fatalf("reset fork block %d: %v, %d", blk, err, buf[0])
		}
	}
	// An unlink makes no call either; the next send drops the fork there.
	calls = h.total()
	w += 10
	if err := be.UnlinkRel(ctx, empty[2], w); err != nil {
		t.Fatal(err)
	}
	if n := h.total() - calls; n != 0 {
		t.Fatalf("an unlink made %d calls to the pageserver, want 0", n)
	}
	if _, err := be.Nblocks(ctx, empty[2]); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("unlinked %s here: %v", empty[2], err)
	}
	other = open(t, h, psbackend.Options{})
	if _, err := other.Nblocks(ctx, empty[2]); err != nil {
		t.Fatalf("%s before the send of its unlink: %v", empty[2], err)
	}
	if err := be.Sync(ctx, w); err != nil {
		t.Fatal(err)
	}
	other = open(t, h, psbackend.Options{})
	if _, err := other.Nblocks(ctx, empty[2]); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("unlinked %s after Sync: %v", empty[2], err)
	}
	// Unlinked and created again before a send: a new, empty fork.
	w += 10
	if err := be.UnlinkRel(ctx, empty[0], w); err != nil {
		t.Fatal(err)
	}
	w += 10
	if err := be.CreateRel(ctx, empty[0], w); err != nil {
		t.Fatal(err)
	}
	// A fork created after the last send, by a Backend that then dies
	// without sending (no Close): gone.
	lost := pg.RelTag{Spc: 1663, DB: 5, Rel: 16400}
	w += 10
	if err := be.CreateRel(ctx, lost, w); err != nil {
		t.Fatal(err)
	}
	other = open(t, h, psbackend.Options{})
	if _, err := other.Nblocks(ctx, lost); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("unsent %s: %v", lost, err)
	}
	if n, err := other.Nblocks(ctx, empty[0]); err != nil || n != 0 {
		t.Fatalf("%s after the unlink of another: %d blocks, %v", empty[0], n, err)
	}
	// A file written after a fork was created reaches the pageserver after
	// the fork (a checkpoint's pg_control must not get there before the
	// forks created before the checkpoint, which Postgres never fsyncs).
	w += 10
	if err := be.Mkdir(ctx, "global", 0o700, w); err != nil {
		t.Fatal(err)
	}
	other = open(t, h, psbackend.Options{})
	if n, err := other.Nblocks(ctx, lost); err != nil || n != 0 {
		t.Fatalf("%s once a folder made after it is stored: %d blocks, %v", lost, n, err)
	}
	lost2 := pg.RelTag{Spc: 1663, DB: 5, Rel: 16401}
	if err := be.CreateRel(ctx, lost2, w); err != nil {
		t.Fatal(err)
	}
	if err := be.CreateFile(ctx, "global/pg_control", 0o600, w); err != nil {
		t.Fatal(err)
	}
	if err := be.WriteFile(ctx, "global/pg_control", 0, []byte("checkpoint"), w); err != nil {
		t.Fatal(err)
	}
	other = open(t, h, psbackend.Options{})
	if n, err := other.Nblocks(ctx, lost2); err != nil || n != 0 {
		t.Fatalf("%s once a file written after it is stored: %d blocks, %v", lost2, n, err)
	}
	if n, err := other.Nblocks(ctx, empty[0]); err != nil || n != 0 {
		t.Fatalf("%s unlinked and created again: %d blocks, %v", empty[0], n, err)
	}
}

// TestConcurrentForks: writers on four forks (extensions, rewrites,
// truncations) with W from one shared counter and a small buffer, so that
// flushes from one writer carry the others' pages; each writer reads its
// own writes back as it goes, and after Sync a fresh Backend on the same
// timeline holds every fork's final size and content.
func TestConcurrentForks(t *testing.T) {
	ctx := context.Background()
	h := startTimeline(t)
	be := open(t, h, psbackend.Options{StandaloneCommit: true, WriteBuffer: 16, ZeroBatch: 8})
	var wmu sync.Mutex
	var wpos pg.LSN = 10
	nextW := func() pg.LSN {
		wmu.Lock()
		defer wmu.Unlock()
		wpos++
		return wpos
	}
	const forks = 4
	models := make([]map[uint32]byte, forks)
	sizes := make([]uint32, forks)
	var wg sync.WaitGroup
	for f := 0; f < forks; f++ {
		rel := pg.RelTag{Spc: 1663, DB: 5, Rel: uint32(20000 + f)}
		if err := be.CreateRel(ctx, rel, nextW()); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func(f int, rel pg.RelTag) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(f), 7))
			model := map[uint32]byte{}
			var size uint32
			buf := make([]byte, pg.BlockSize)
			for i := 0; i < 300; i++ {
				switch r := rng.IntN(20); {
				case r == 0 && size > 0:
					n := rng.Uint32N(size)
					if err := be.TruncateRel(ctx, rel, n, nextW()); err != nil {
						t.Error(err)
						return
					}
					for blk := range model {
						if blk >= n {
							delete(model, blk)
						}
					}
					size = n
				default:
					blk := rng.Uint32N(size + 3)
					v := byte(rng.IntN(250) + 1)
					if err := be.WritePage(ctx, rel.Page(blk), page(v), nextW()); err != nil {
						t.Error(err)
						return
					}
					model[blk] = v
					size = max(size, blk+1)
				}
				blk := rng.Uint32N(size + 1)
				if blk >= size {
					continue
				}
				if err := be.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, page(model[blk])) {
					t.Errorf("fork %d block %d: %v, %d; want %d", f, blk, err, buf[0], model[blk])
					return
				}
			}
			models[f], sizes[f] = model, size
		}(f, rel)
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if err := be.Sync(ctx, nextW()); err != nil {
		t.Fatal(err)
	}
	fresh := open(t, h, psbackend.Options{})
	buf := make([]byte, pg.BlockSize)
	for f := 0; f < forks; f++ {
		rel := pg.RelTag{Spc: 1663, DB: 5, Rel: uint32(20000 + f)}
		if n, err := fresh.Nblocks(ctx, rel); err != nil || n != sizes[f] {
			t.Fatalf("fork %d: %d blocks, %v; want %d", f, n, err, sizes[f])
		}
		for blk := uint32(0); blk < sizes[f]; blk++ {
			if err := fresh.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, page(models[f][blk])) {
				t.Fatalf("fork %d block %d after Sync: %v, %d; want %d", f, blk, err, buf[0], models[f][blk])
			}
		}
	}
}

// TestReadPages: the read-ahead's batch read answers like ReadPage for
// each page (the write buffer first, then one GetPages for the rest), and
// a page past the end or of a missing fork fails alone.
func TestReadPages(t *testing.T) {
	ctx := context.Background()
	h, be, rel := bufferedRel(t, 100)
	writeBlocks(t, be, rel, 5, 110)
	if err := be.Sync(ctx, 200); err != nil {
		t.Fatal(err)
	}
	if err := be.WritePage(ctx, rel.Page(2), page(33), 300); err != nil { // buffered
		t.Fatal(err)
	}
	keys := []pg.PageKey{rel.Page(0), rel.Page(1), rel.Page(2), rel.Page(4), rel.Page(9), {Spc: 1663, DB: 5, Rel: 99999}}
	pages := make([][]byte, len(keys))
	nms := make([]pg.LSN, len(keys))
	for i := range pages {
		pages[i] = make([]byte, pg.BlockSize)
		nms[i] = 300
	}
	gets := h.count("GetPages")
	errs := be.ReadPages(ctx, keys, nms, pages)
	for i, want := range []byte{1, 2, 33, 5} {
		if errs[i] != nil || !bytes.Equal(pages[i], page(want)) {
			t.Errorf("%s: %v, %d; want %d", keys[i], errs[i], pages[i][0], want)
		}
	}
	for _, i := range []int{4, 5} {
		if !errors.Is(errs[i], fusefs.ErrNotFound) {
			t.Errorf("%s: %v, want not found", keys[i], errs[i])
		}
	}
	if n := h.count("GetPages") - gets; n != 1 {
		t.Errorf("%d GetPages calls for one batch, want 1", n)
	}
}
