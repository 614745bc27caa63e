package client_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/server"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/pg"
)

// harness runs a pageserver with its gRPC server on a free loopback port.
type harness struct {
	ps   *pageserver.Pageserver
	g    *grpc.Server
	addr string
	c    *client.Client
}

func start(tb testing.TB, dir string, store objectstore.Store) *harness {
	tb.Helper()
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = dir
	cfg.WaitLSNTimeout = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	ps, err := pageserver.New(context.Background(), cfg, pageserver.Deps{Log: zerolog.Nop(), Registry: reg, Store: store})
	if err != nil {
		tb.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(256 << 20))
	server.New(ps, zerolog.Nop(), reg).Register(g)
	go g.Serve(lis)
	c, err := client.Dial(lis.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{ps: ps, g: g, addr: lis.Addr().String(), c: c}
	tb.Cleanup(h.stop)
	return h
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

var (
	tl  = pg.TimelineID{0xAA, 1}
	rel = pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
)

func page(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }

func TestEndToEnd(t *testing.T) {
	ctx := context.Background()
	store := objectstore.NewMemory()
	h := start(t, t.TempDir(), store)
	c := h.c
	if _, err := c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTimeline(ctx, tl); !errors.Is(err, pageserver.ErrTimelineExists) {
		t.Fatalf("duplicate create: %v", err)
	}
	var ws []client.PageWrite
	for b := uint32(0); b < 64; b++ {
		ws = append(ws, client.PageWrite{Page: rel.Page(b), W: 1000, Data: page(byte(b))})
	}
	d, err := c.PutPages(ctx, tl, ws)
	if err != nil {
		t.Fatal(err)
	}
	if d >= 1000 {
		t.Fatalf("durable %s before the commit LSN moved", d)
	}
	if err := c.AdvanceCommitLSN(ctx, tl, 1000); err != nil {
		t.Fatal(err)
	}
	infos, _ := c.ListTimelines(ctx)
	if len(infos) != 1 || infos[0].LSNs.Durable < 1000 || infos[0].LSNs.Pending != 0 {
		t.Fatalf("timelines: %+v", infos)
	}
	// Batched reads from many goroutines over the one stream.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			var reqs []client.PageRequest
			for b := uint32(0); b < 64; b += uint32(g%4 + 1) {
				reqs = append(reqs, client.PageRequest{Page: rel.Page(b), RequestLSN: client.LatestLSN})
			}
			reqs = append(reqs, client.PageRequest{Page: rel.Page(500), RequestLSN: client.LatestLSN})
			res, err := c.GetPages(ctx, tl, reqs)
			if err != nil {
				errs <- err
				return
			}
			for i, r := range res[:len(res)-1] {
				if r.Err != nil || !bytes.Equal(r.Data, page(byte(reqs[i].Page.Block))) {
					errs <- errors.New("wrong page")
					return
				}
			}
			if !errors.Is(res[len(res)-1].Err, timeline.ErrNotFound) {
				errs <- errors.New("block past the end did not fail with ErrNotFound")
			}
		}(g)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if _, err := c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(0), RequestLSN: client.LatestLSN, NotModifiedSince: 5000}); !errors.Is(err, timeline.ErrWaitLSNTimeout) {
		t.Fatalf("not_modified_since ahead: %v", err)
	}
	if _, err := c.GetPage(ctx, pg.TimelineID{9}, client.PageRequest{Page: rel.Page(0), RequestLSN: client.LatestLSN}); !errors.Is(err, pageserver.ErrNoTimeline) {
		t.Fatalf("unknown timeline: %v", err)
	}
	sz, err := c.Nblocks(ctx, tl, []pg.RelTag{rel, {Spc: 1663, DB: 5, Rel: 1}}, client.LatestLSN, 0)
	if err != nil || !sz[0].Exists || sz[0].Nblocks != 64 || sz[1].Exists {
		t.Fatalf("nblocks %+v %v", sz, err)
	}
	if n, _ := c.DBSize(ctx, tl, 1663, 5, client.LatestLSN); n != 64*pg.BlockSize {
		t.Fatalf("dbsize %d", n)
	}
	// Files.
	if err := c.WriteFile(ctx, tl, "global/pg_control", 0, page('c'), 1100); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteFile(ctx, tl, "PG_VERSION", 0, []byte("15\n"), 1100); err != nil {
		t.Fatal(err)
	}
	_ = c.AdvanceCommitLSN(ctx, tl, 1100)
	if got, err := c.GetFile(ctx, tl, "PG_VERSION", client.LatestLSN); err != nil || string(got) != "15\n" {
		t.Fatalf("GetFile: %q %v", got, err)
	}
	if _, err := c.GetFile(ctx, tl, "nope", client.LatestLSN); !errors.Is(err, timeline.ErrNotFound) {
		t.Fatalf("missing file: %v", err)
	}
	files, rels, err := c.ListFiles(ctx, tl, client.LatestLSN)
	if err != nil || len(files) != 2 || len(rels) != 1 || rels[0] != rel {
		t.Fatalf("ListFiles %v %v %v", files, rels, err)
	}
	// Basebackup.
	var buf bytes.Buffer
	if err := c.Basebackup(ctx, tl, client.LatestLSN, &buf); err != nil {
		t.Fatal(err)
	}
	names := map[string]int64{}
	tr := tar.NewReader(&buf)
	for {
		hd, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		names[hd.Name] = int64(len(data))
		if hd.Name == "base/5/16384" && !bytes.Equal(data[8192*7:8192*8], page(7)) {
			t.Fatal("basebackup page 7")
		}
	}
	if names["base/5/16384"] != 64*pg.BlockSize || names["PG_VERSION"] != 3 || names["global/pg_control"] != pg.BlockSize {
		t.Fatalf("basebackup entries: %v", names)
	}
	// Branch before a "DELETE": the branch keeps the old page.
	child := pg.TimelineID{0xBB}
	if _, err := c.Branch(ctx, tl, child, 1100); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutPages(ctx, tl, []client.PageWrite{{Page: rel.Page(3), W: 1200, Data: page(0xEE)}}); err != nil {
		t.Fatal(err)
	}
	_ = c.AdvanceCommitLSN(ctx, tl, 1200)
	if got, _ := c.GetPage(ctx, child, client.PageRequest{Page: rel.Page(3), RequestLSN: client.LatestLSN}); !bytes.Equal(got, page(3)) {
		t.Fatal("branch sees the parent's later write")
	}
	// Upload everything, then start a new pageserver on an empty disk.
	for _, x := range h.ps.Timelines() {
		if err := x.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if err := x.Upload(ctx); err != nil {
			t.Fatal(err)
		}
	}
	h.stop()
	h2 := start(t, t.TempDir(), store)
	infos, err = h2.c.ListTimelines(ctx)
	if err != nil || len(infos) != 2 {
		t.Fatalf("timelines after restart on an empty disk: %+v %v", infos, err)
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].ID.String() < infos[j].ID.String() })
	if infos[1].Ancestor != tl || infos[1].AncestorLSN != 1100 {
		t.Fatalf("branch ancestry lost: %+v", infos[1])
	}
	for b := uint32(0); b < 64; b++ {
		want := page(byte(b))
		if b == 3 {
			want = page(0xEE)
		}
		got, err := h2.c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(b), RequestLSN: client.LatestLSN})
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("page %d from the object store: %v", b, err)
		}
	}
	if got, _ := h2.c.GetPage(ctx, child, client.PageRequest{Page: rel.Page(3), RequestLSN: client.LatestLSN}); !bytes.Equal(got, page(3)) {
		t.Fatal("branch after restart on an empty disk")
	}
}

// TestLeaseLSN: a lease shows in the timeline's info until it is ended;
// a lease longer than timeline.MaxLeaseTTL and one on an unknown timeline
// are refused with what is wrong.
func TestLeaseLSN(t *testing.T) {
	ctx := context.Background()
	h := start(t, t.TempDir(), objectstore.NewMemory())
	c := h.c
	if _, err := c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	lease := func() pg.LSN {
		infos, err := c.ListTimelines(ctx)
		if err != nil || len(infos) != 1 {
			t.Fatalf("timelines: %+v, %v", infos, err)
		}
		return infos[0].LSNs.Lease
	}
	end, err := c.LeaseLSN(ctx, tl, 0x5000, "test", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(end); d < 50*time.Second || d > 70*time.Second {
		t.Fatalf("a lease of a minute ends in %s", d)
	}
	if _, err := c.LeaseLSN(ctx, tl, 0x3000, "test", time.Minute); err != nil {
		t.Fatal(err)
	}
	if l := lease(); l != 0x3000 {
		t.Fatalf("lease %s, want the lower of 0/3000 and 0/5000", l)
	}
	if end, err := c.LeaseLSN(ctx, tl, 0x3000, "test", 0); err != nil || !end.IsZero() {
		t.Fatalf("ending a lease: %s, %v", end, err)
	}
	if l := lease(); l != 0x5000 {
		t.Fatalf("lease %s after 0/3000 ended, want 0/5000", l)
	}
	if _, err := c.LeaseLSN(ctx, tl, 0x5000, "test", 2*timeline.MaxLeaseTTL); err == nil || !strings.Contains(err.Error(), "lease length") {
		t.Fatalf("a lease of two hours: %v, want a refusal that names the lease length", err)
	}
	if _, err := c.LeaseLSN(ctx, pg.TimelineID{0xBB}, 0x5000, "test", time.Minute); !errors.Is(err, pageserver.ErrNoTimeline) {
		t.Fatalf("a lease on an unknown timeline: %v, want ErrNoTimeline", err)
	}
}

// TestUploadTroubleReported: while uploads to the object store fail, the
// timeline's info says since when, how many and why (what `strata status`
// prints); the next upload that succeeds clears it.
func TestUploadTroubleReported(t *testing.T) {
	ctx := context.Background()
	store := faulty.New(objectstore.NewMemory(), faulty.Config{})
	store.Add(faulty.Rule{Ops: faulty.OpPut, Err: errors.New("the store is down")})
	h := start(t, t.TempDir(), store)
	before := time.Now().Add(-time.Second)
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil { // its first upload fails
		t.Fatal(err)
	}
	ptl, err := h.ps.Timeline(tl)
	if err != nil {
		t.Fatal(err)
	}
	if err := ptl.Upload(ctx); err == nil {
		t.Fatal("an upload to a store that is down succeeded")
	}
	infos, err := h.c.ListTimelines(ctx)
	if err != nil {
		t.Fatal(err)
	}
	u := infos[0].Upload
	if u.Failures < 2 || !strings.Contains(u.Err, "the store is down") || u.Since.Before(before) || u.Since.After(time.Now()) {
		t.Fatalf("upload trouble while the store is down: %+v", u)
	}
	store.Reset() // the store is back
	if err := ptl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	if infos, err = h.c.ListTimelines(ctx); err != nil || infos[0].Upload.Failures != 0 || infos[0].Upload.Err != "" {
		t.Fatalf("upload trouble after an upload succeeded: %+v, %v", infos, err)
	}
}
