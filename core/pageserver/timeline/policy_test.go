package timeline

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

// TestPushdownMaterializes: with PushdownPolicy{N: 3}, the third delta
// after a base version makes Ingest store an image at the same LSN, so
// reads stop there.
func TestPushdownMaterializes(t *testing.T) {
	ctx := context.Background()
	tl, err := Open(ctx, pg.TimelineID{0xD0}, t.TempDir(), smallOpts(), Deps{Log: zerolog.Nop(), Commit: &CommitLSN{},
		Redo: concatRedo{}, Policy: PushdownPolicy{N: 3}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 1})
	steps := []Change{
		{Key: k, LSN: 10, Kind: layer.WillInit, Data: []byte("a")},
		{Key: k, LSN: 20, Kind: layer.Delta, Data: []byte("b")},
		{Key: k, LSN: 30, Kind: layer.Delta, Data: []byte("c")},
		{Key: k, LSN: 40, Kind: layer.Delta, Data: []byte("d")},
	}
	for _, c := range steps {
		if err := tl.Ingest(ctx, []Change{c}, c.LSN); err != nil {
			t.Fatal(err)
		}
	}
	cs, _, err := tl.collect(ctx, k, 40)
	if err != nil {
		t.Fatal(err)
	}
	// b, c, d are three deltas after the will_init a: an image at 40,
	// ranked above the delta at the same LSN, ends the read.
	if len(cs) != 1 || cs[0].v.Kind != layer.Image || cs[0].v.LSN != 40 || string(cs[0].v.Data) != "abcd" {
		for _, c := range cs {
			t.Logf("%s %s %q", c.v.LSN, c.v.Kind, c.v.Data)
		}
		t.Fatal("no image materialized after 3 deltas")
	}
	if got, _ := tl.Get(ctx, k, 40); string(got) != "abcd" {
		t.Fatalf("value %q", got)
	}
	if got, _ := tl.Get(ctx, k, 35); string(got) != "abc" {
		t.Fatalf("value at 35 %q", got)
	}
}

// unsupportedRedo is concatRedo, except that a record "x" is one it
// cannot replay.
type unsupportedRedo struct{ concatRedo }

func (r unsupportedRedo) Apply(k keyspace.Key, lsn pg.LSN, base []byte, recs [][]byte) ([]byte, error) {
	for _, rec := range recs {
		if string(rec) == "x" {
			return nil, fmt.Errorf("%w: X/INSERT", redo.ErrUnsupported)
		}
	}
	return r.concatRedo.Apply(k, lsn, base, recs)
}

// TestPushdownUnsupportedRecord: a page whose chain holds a record the
// redo engine cannot replay gets no image, but Ingest stores its deltas
// and goes on (one unsupported index must not stop the WAL of every other
// page), the other pages get their images, reads of that page fail with
// redo.ErrUnsupported, and a base version (a full page image) makes it
// readable again.
func TestPushdownUnsupportedRecord(t *testing.T) {
	ctx := context.Background()
	tl, err := Open(ctx, pg.TimelineID{0xD5}, t.TempDir(), smallOpts(), Deps{Log: zerolog.Nop(), Commit: &CommitLSN{},
		Redo: unsupportedRedo{}, Policy: PushdownPolicy{N: 2}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	bad := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 1})
	good := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 2})
	batches := [][]Change{
		{{Key: bad, LSN: 10, Kind: layer.WillInit, Data: []byte("a")}, {Key: good, LSN: 10, Kind: layer.WillInit, Data: []byte("a")}},
		{{Key: bad, LSN: 20, Kind: layer.Delta, Data: []byte("x")}, {Key: good, LSN: 20, Kind: layer.Delta, Data: []byte("b")}},
		{{Key: bad, LSN: 30, Kind: layer.Delta, Data: []byte("c")}, {Key: good, LSN: 30, Kind: layer.Delta, Data: []byte("c")}},
		{{Key: bad, LSN: 40, Kind: layer.Delta, Data: []byte("d")}, {Key: good, LSN: 40, Kind: layer.Delta, Data: []byte("d")}},
	}
	for _, b := range batches {
		if err := tl.Ingest(ctx, b, b[0].LSN); err != nil {
			t.Fatalf("Ingest at %s: %v", b[0].LSN, err)
		}
	}
	if got := tl.LSNs().LastRecord; got != 40 {
		t.Fatalf("last record %s, want 0/28: ingest stopped", got)
	}
	if got, err := tl.Get(ctx, good, 40); err != nil || string(got) != "abcd" {
		t.Fatalf("good page: %q, %v", got, err)
	}
	// b and c made an image at 30: the read of 40 stops there.
	if cs, _, err := tl.collect(ctx, good, 40); err != nil || len(cs) != 2 || cs[1].v.Kind != layer.Image || cs[1].v.LSN != 30 {
		t.Fatalf("good page: %d versions, want d on the image at 30 (%v)", len(cs), err)
	}
	if _, err := tl.Get(ctx, bad, 40); !errors.Is(err, redo.ErrUnsupported) {
		t.Fatalf("unsupported page: %v, want redo.ErrUnsupported", err)
	}
	cs, _, err := tl.collect(ctx, bad, 40)
	if err != nil || len(cs) != 4 {
		t.Fatalf("unsupported page: %d versions (%v), want its 4 kept", len(cs), err)
	}
	if got, err := tl.Get(ctx, bad, 10); err != nil || string(got) != "a" {
		t.Fatalf("unsupported page before the record: %q, %v", got, err)
	}
	// A full page image ends the chain the engine cannot replay.
	if err := tl.Ingest(ctx, []Change{{Key: bad, LSN: 50, Kind: layer.Image, Data: []byte("F")}, {Key: bad, LSN: 60, Kind: layer.Delta, Data: []byte("g")}}, 60); err != nil {
		t.Fatal(err)
	}
	if got, err := tl.Get(ctx, bad, 60); err != nil || string(got) != "Fg" {
		t.Fatalf("after a full page image: %q, %v", got, err)
	}
}

// TestBackpressure: a writer that never lets the background flush (there is
// none here) still keeps at most maxFrozen frozen layers.
func TestBackpressure(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	o := smallOpts()
	o.CheckpointDistance = 8 << 10
	tl, err := Open(ctx, pg.TimelineID{0xD1}, t.TempDir(), o, Deps{Log: zerolog.Nop(), Commit: commit})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	for i := 0; i < 60; i++ {
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(uint32(i)), W: pg.LSN(10 + i), Data: page(byte(i))}}); err != nil {
			t.Fatal(err)
		}
		tl.mu.RLock()
		n := len(tl.frozen)
		tl.mu.RUnlock()
		if n > maxFrozen {
			t.Fatalf("%d frozen layers", n)
		}
	}
	if len(tl.Layers()) == 0 {
		t.Fatal("nothing flushed")
	}
}

// ingestWithPolicy ingests cs: Ingest stores the images DueImages asks
// for after the batch, at the same LSNs.
func ingestWithPolicy(t *testing.T, tl *Timeline, cs []Change, last pg.LSN) {
	t.Helper()
	if err := tl.Ingest(context.Background(), cs, last); err != nil {
		t.Fatal(err)
	}
}

// imagesOf returns the LSNs of k's image versions at or below upto that
// follow its first version (the images the policy made), oldest first.
func imagesOf(t *testing.T, tl *Timeline, k keyspace.Key) []pg.LSN {
	t.Helper()
	var out []pg.LSN
	s := tl.snap(k, LatestLSN)
	var vs []layer.Version
	for _, m := range s.mems {
		vs = m.Versions(vs[:0], k, LatestLSN)
		for _, v := range vs {
			if v.Kind == layer.Image {
				out = append(out, v.LSN)
			}
		}
	}
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func openPolicy(t *testing.T, p ImagePolicy) *Timeline {
	t.Helper()
	tl, err := Open(context.Background(), pg.TimelineID{0xD2}, t.TempDir(), smallOpts(), Deps{Log: zerolog.Nop(), Commit: &CommitLSN{},
		Redo: concatRedo{}, Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl.Close() })
	return tl
}

// TestPushdownBytes: PushdownPolicy{NBytes: 10} materializes a key once
// its deltas since the last image add up to 10 bytes, whatever their
// count, and the image holds exactly the redo of the chain.
func TestPushdownBytes(t *testing.T) {
	tl := openPolicy(t, PushdownPolicy{NBytes: 10})
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 2})
	steps := []Change{
		{Key: k, LSN: 10, Kind: layer.Image, Data: []byte("base")},
		{Key: k, LSN: 20, Kind: layer.Delta, Data: []byte("1234")},
		{Key: k, LSN: 30, Kind: layer.Delta, Data: []byte("5678")},
		{Key: k, LSN: 40, Kind: layer.Delta, Data: []byte("90")},         // 10 bytes: image
		{Key: k, LSN: 50, Kind: layer.Delta, Data: []byte("abcdefghij")}, // 10 bytes alone: image
		{Key: k, LSN: 60, Kind: layer.Delta, Data: []byte("k")},
	}
	for _, c := range steps {
		ingestWithPolicy(t, tl, []Change{c}, c.LSN)
	}
	if got := imagesOf(t, tl, k); len(got) != 3 || got[1] != 40 || got[2] != 50 {
		t.Fatalf("images at %v, want [10 40 50]", got)
	}
	cs, _, err := tl.collect(context.Background(), k, 45)
	if err != nil || len(cs) != 1 || cs[0].v.Kind != layer.Image || string(cs[0].v.Data) != "base1234567890" {
		t.Fatalf("read at 45: %d versions, %v", len(cs), err)
	}
	if got, _ := tl.Get(context.Background(), k, 60); string(got) != "base1234567890abcdefghijk" {
		t.Fatalf("value at 60 %q", got)
	}
}

// TestHotPolicyBurst: with HotPolicy{Burst: 3} (and a larger byte
// limit), a key that gets three deltas in one ingest batch is materialized
// at the third; a key with one delta per batch is not, until the limit.
// (N stays 0: Ingest's own MaterializeAfter rule would count too.)
func TestHotPolicyBurst(t *testing.T) {
	tl := openPolicy(t, HotPolicy{PushdownPolicy: PushdownPolicy{NBytes: 5}, Burst: 3})
	hot := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 3})
	cold := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 4})
	ingestWithPolicy(t, tl, []Change{
		{Key: hot, LSN: 10, Kind: layer.Image, Data: []byte("H")},
		{Key: cold, LSN: 10, Kind: layer.Image, Data: []byte("C")},
	}, 10)
	// One batch: hot gets a, b, c (burst of 3), cold gets one delta.
	ingestWithPolicy(t, tl, []Change{
		{Key: hot, LSN: 20, Kind: layer.Delta, Data: []byte("a")},
		{Key: cold, LSN: 20, Kind: layer.Delta, Data: []byte("x")},
		{Key: hot, LSN: 30, Kind: layer.Delta, Data: []byte("b")},
		{Key: hot, LSN: 40, Kind: layer.Delta, Data: []byte("c")},
	}, 40)
	if got := imagesOf(t, tl, hot); len(got) != 2 || got[1] != 40 {
		t.Fatalf("hot key images at %v, want [10 40]", got)
	}
	if got := imagesOf(t, tl, cold); len(got) != 1 {
		t.Fatalf("cold key images at %v, want [10]", got)
	}
	// Cold: one 1-byte delta per batch; the fifth since its image (5 bytes) makes one.
	for lsn := pg.LSN(50); lsn <= 90; lsn += 10 {
		ingestWithPolicy(t, tl, []Change{{Key: cold, LSN: lsn, Kind: layer.Delta, Data: []byte("y")}}, lsn)
		want := 1
		if lsn >= 80 {
			want = 2
		}
		if got := imagesOf(t, tl, cold); len(got) != want {
			t.Fatalf("after the delta at %d: cold images at %v, want %d", lsn, got, want)
		}
	}
	if got, _ := tl.Get(context.Background(), cold, 90); string(got) != "Cxyyyyy" {
		t.Fatalf("cold value %q", got)
	}
	if got, _ := tl.Get(context.Background(), hot, 40); string(got) != "Habc" {
		t.Fatalf("hot value %q", got)
	}
}

// TestFPIPolicyNeverRedoes: the fpi policy makes no images of its own and
// an SDKPolicy wraps any sdk/redo policy.
func TestFPIPolicyNeverRedoes(t *testing.T) {
	for _, p := range []ImagePolicy{FPIPolicy{}, SDKPolicy{PolicyName: "sdk-fpi", Policy: redo.FPIPolicy{}}} {
		tl := openPolicy(t, p)
		k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 5})
		ingestWithPolicy(t, tl, []Change{{Key: k, LSN: 10, Kind: layer.WillInit, Data: []byte("w")}}, 10)
		for lsn := pg.LSN(20); lsn < 200; lsn += 10 {
			ingestWithPolicy(t, tl, []Change{{Key: k, LSN: lsn, Kind: layer.Delta, Data: []byte("d")}}, lsn)
		}
		if got := imagesOf(t, tl, k); len(got) != 0 {
			t.Fatalf("%s: images at %v", p.Name(), got)
		}
	}
	tl := openPolicy(t, SDKPolicy{PolicyName: "sdk-delta", Policy: redo.DeltaPolicy{NDeltas: 2}})
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 6})
	ingestWithPolicy(t, tl, []Change{{Key: k, LSN: 10, Kind: layer.WillInit, Data: []byte("w")}}, 10)
	for lsn := pg.LSN(20); lsn <= 50; lsn += 10 {
		ingestWithPolicy(t, tl, []Change{{Key: k, LSN: lsn, Kind: layer.Delta, Data: []byte("d")}}, lsn)
	}
	if got := imagesOf(t, tl, k); len(got) != 2 || got[0] != 30 || got[1] != 50 {
		t.Fatalf("sdk delta policy: images at %v, want [30 50]", got)
	}
}

func TestChainState(t *testing.T) {
	var s chainState
	for i := 0; i < 5; i++ {
		s = s.add(1000)
	}
	if s.deltas() != 5 || s.bytes() != 5000 {
		t.Fatalf("deltas %d bytes %d", s.deltas(), s.bytes())
	}
}

// TestDueImagesTwiceInOneBatch: a key due twice within one ingest batch
// gets one image, at its last due delta, holding the whole chain (the page
// cache must not hand an earlier materialization back as the newest).
func TestDueImagesTwiceInOneBatch(t *testing.T) {
	tl := openPolicy(t, SDKPolicy{PolicyName: "sdk-delta", Policy: redo.DeltaPolicy{NDeltas: 2}})
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 7})
	ingestWithPolicy(t, tl, []Change{
		{Key: k, LSN: 10, Kind: layer.WillInit, Data: []byte("a")},
		{Key: k, LSN: 20, Kind: layer.Delta, Data: []byte("b")},
		{Key: k, LSN: 30, Kind: layer.Delta, Data: []byte("c")}, // due
		{Key: k, LSN: 40, Kind: layer.Delta, Data: []byte("d")},
		{Key: k, LSN: 50, Kind: layer.Delta, Data: []byte("e")}, // due again
		{Key: k, LSN: 60, Kind: layer.Delta, Data: []byte("f")},
	}, 60)
	if got := imagesOf(t, tl, k); len(got) != 1 || got[0] != 50 {
		t.Fatalf("images at %v, want [50]", got)
	}
	cs, _, err := tl.collect(context.Background(), k, 50)
	if err != nil || len(cs) != 1 || string(cs[0].v.Data) != "abcde" {
		t.Fatalf("image at 50: %d versions, %v", len(cs), err)
	}
	for _, c := range []struct {
		lsn  pg.LSN
		want string
	}{{LatestLSN, "abcdef"}, {60, "abcdef"}, {45, "abcd"}, {30, "abc"}} {
		if got, err := tl.Get(context.Background(), k, c.lsn); err != nil || string(got) != c.want {
			t.Fatalf("value at %v: %q, %v, want %q", c.lsn, got, err, c.want)
		}
	}
}

// TestWritebackImageLayerRule: an image layer is wanted after
// ImageLayerBytes of deltas, and never before the deltas reach the size of
// the images the pass replaces, so image writes stay at most one byte per byte of
// page writes however big the database is.
func TestWritebackImageLayerRule(t *testing.T) {
	p := WritebackPolicy{ImageLayerBytes: 100}
	for _, c := range []struct {
		deltas, image int64
		want          bool
	}{
		{99, 0, false}, {100, 0, true}, // no image yet: the fixed limit
		{100, 50, true}, {150, 400, false}, {400, 400, true}, // the image's size as a floor
	} {
		if got := p.WantImageLayer(3, c.deltas, c.image); got != c.want {
			t.Errorf("WantImageLayer(deltas %d, image %d) = %v, want %v", c.deltas, c.image, got, c.want)
		}
	}
	if (WritebackPolicy{}).WantImageLayer(1, 255<<20, 0) || !(WritebackPolicy{}).WantImageLayer(1, 256<<20, 0) {
		t.Error("the default limit is not 256 MiB")
	}
}

// TestDeltasSinceImage: the timeline reports the deltas above the image
// of a range they overlap and the bytes of the image files a pass would
// replace, which the policy weighs.
func TestDeltasSinceImage(t *testing.T) {
	ctx := context.Background()
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	tl := openT(t, t.TempDir(), commit, nil, pg.TimelineID{0xD1}, nil, 0)
	defer tl.Close()
	w := pg.LSN(100)
	put := func(blocks int) {
		t.Helper()
		var ws []PageWrite
		for i := 0; i < blocks; i++ {
			ws = append(ws, PageWrite{Page: rel.Page(uint32(i)), W: w, Data: page(byte(w))})
		}
		w += 10
		if _, err := tl.PutPages(ctx, ws); err != nil {
			t.Fatal(err)
		}
		if err := tl.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	put(64)
	if n, b, img := tl.deltasSinceImage(); n == 0 || b < 64*pg.BlockSize || img != 0 {
		t.Fatalf("before any image: %d deltas, %d bytes, image %d", n, b, img)
	}
	if err := tl.CreateImageLayer(ctx, tl.LSNs().Durable); err != nil {
		t.Fatal(err)
	}
	var whole int64
	for _, d := range tl.Layers() {
		if d.Kind == layer.ImageLayer {
			whole += d.Size
		}
	}
	if n, b, img := tl.deltasSinceImage(); n != 0 || b != 0 || img != 0 || whole < 64*pg.BlockSize {
		t.Fatalf("after the image (%d bytes): %d deltas, %d bytes, image %d", whole, n, b, img)
	}
	put(8)
	n, b, img := tl.deltasSinceImage()
	if n == 0 || b == 0 || img == 0 || img >= whole {
		t.Fatalf("after 8 more pages: %d deltas, %d bytes, image %d (of %d)", n, b, img, whole)
	}
	p := WritebackPolicy{ImageLayerBytes: 1}
	if p.WantImageLayer(n, b, img) != (b >= img) {
		t.Fatalf("WantImageLayer(%d, %d, %d) = %v", n, b, img, !(b >= img))
	}
	for b < img {
		put(8)
		n, b, img = tl.deltasSinceImage()
	}
	if !p.WantImageLayer(n, b, img) {
		t.Fatal("no image layer wanted once the deltas outgrew the images they would replace")
	}
}

// TestRetryAfter: the background loop's spacing of a failing step (upload,
// image layer): min after the first failure, doubling, capped at max, and
// due again at once after a success.
func TestRetryAfter(t *testing.T) {
	r := retryAfter{min: 30 * time.Second, max: 2 * time.Minute}
	now := time.Unix(1000, 0)
	if !r.due(now) {
		t.Fatal("a step that never failed is not due")
	}
	for i, want := range []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 2 * time.Minute} {
		if got := r.failed(now); got != want {
			t.Fatalf("failure %d: wait %s, want %s", i+1, got, want)
		}
		if r.due(now.Add(want - time.Second)) {
			t.Fatalf("failure %d: due before its wait", i+1)
		}
		if !r.due(now.Add(want)) {
			t.Fatalf("failure %d: not due after its wait", i+1)
		}
	}
	r.succeeded()
	if !r.due(now) || r.failed(now) != 30*time.Second {
		t.Fatal("a success did not reset the wait")
	}
}
