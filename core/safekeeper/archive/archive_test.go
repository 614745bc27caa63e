package archive

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

const seg = 64 << 10

// countingStore counts the Puts of each key.
type countingStore struct {
	objectstore.Store
	mu   sync.Mutex
	puts map[string]int
}

func (c *countingStore) Put(ctx context.Context, key string, r io.Reader, o objectstore.PutOptions) error {
	c.mu.Lock()
	c.puts[key]++
	c.mu.Unlock()
	return c.Store.Put(ctx, key, r, o)
}

// group opens n stores holding the same WAL (wal bytes from start).
func group(t *testing.T, n int, start pg.LSN, wal []byte) []*walstore.Store {
	var out []*walstore.Store
	for i := 0; i < n; i++ {
		st, err := walstore.Open(walstore.Options{Dir: t.TempDir(), SegmentSize: seg, NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := st.Init(start, 7, 1); err != nil {
			t.Fatal(err)
		}
		if err := st.Write(start, wal); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Flush(); err != nil {
			t.Fatal(err)
		}
		out = append(out, st)
	}
	return out
}

// TestGroupUploadsEachSegmentOnce: three members archive the same WAL;
// each full segment is uploaded once (by its owner), every member counts
// all of them archived, and the archive holds the WAL byte for byte. With
// the owner of some segments gone, the others take over after Takeover.
func TestGroupUploadsEachSegmentOnce(t *testing.T) {
	ctx := context.Background()
	const start = pg.LSN(4 * seg)
	wal := make([]byte, 7*seg+1000) // 7 full segments and a partial one
	rand.New(rand.NewSource(1)).Read(wal)
	end := start + pg.LSN(len(wal))
	sts := group(t, 3, start, wal)
	store := &countingStore{Store: objectstore.NewMemory(), puts: map[string]int{}}
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	var archs []*Archiver
	for i, st := range sts {
		archs = append(archs, New(Options{Store: store, Prefix: "wal", Rank: i, GroupSize: 3, Takeover: 30 * time.Second,
			Logger: zerolog.Nop(), Now: clock}, st))
	}
	// Member 2 is gone: the segments it owns (numbers 5, 8, 11) wait.
	full := end / seg * seg
	step := func(members ...int) []pg.LSN {
		var got []pg.LSN
		for _, m := range members {
			a, err := archs[m].Step(ctx, end)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, a)
		}
		return got
	}
	for round := 0; round < 5; round++ {
		step(0, 1)
		now = now.Add(time.Second)
	}
	if got := step(0, 1); got[0] != 5*seg || got[1] != 5*seg {
		t.Fatalf("archived %v with segment 5's owner gone, want %d", got, 5*seg)
	}
	for k, n := range store.puts {
		if n != 1 {
			t.Fatalf("%s uploaded %d times", k, n)
		}
	}
	// Segments 4..10 are full; member 2 owns 5 and 8.
	if len(store.puts) != 5 || store.puts["wal/7/000000010000000000000005"] != 0 || store.puts["wal/7/000000010000000000000008"] != 0 {
		t.Fatalf("uploads before the takeover: %v; want 4, 6, 7, 9 and 10", store.puts)
	}
	now = now.Add(31 * time.Second)
	if got := step(0, 1); got[0] != full || got[1] != full {
		t.Fatalf("archived %v after the takeover, want %s", got, full)
	}
	// Member 2 comes back: it finds everything there and uploads nothing.
	before := len(store.puts)
	if got := step(2); got[0] != full {
		t.Fatalf("member 2 archived %s, want %s", got[0], full)
	}
	total := 0
	for k, n := range store.puts {
		total += n
		if n != 1 && k[len(k)-8:] != ".partial" {
			t.Fatalf("%s uploaded %d times", k, n)
		}
	}
	if len(store.puts) != before {
		t.Fatalf("member 2 uploaded %d segments the others had", len(store.puts)-before)
	}
	if want := int(full-start) / seg; total != want {
		t.Fatalf("%d uploads for %d full segments", total, want)
	}
	for p := start; p < full; p += seg {
		var buf bytes.Buffer
		name := walstore.SegmentName(1, uint64(p)/seg, seg)
		if err := Fetch(ctx, store, "wal", 7, name, seg, &buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf.Bytes(), wal[p-start:p-start+seg]) {
			t.Fatalf("archived %s differs from the WAL", name)
		}
	}
}

// TestPartialUpToCommit: the partial last segment is uploaded up to the
// commit LSN, which may end inside a block below the flush LSN; a full
// segment with a corrupt block fails its upload and leaves no object.
func TestPartialUpToCommit(t *testing.T) {
	ctx := context.Background()
	const start = pg.LSN(2 * seg)
	wal := make([]byte, 2*seg+5*walstore.BlockSize+300)
	rand.New(rand.NewSource(2)).Read(wal)
	st := group(t, 1, start, wal)[0]
	store := objectstore.NewMemory()
	now := time.Unix(1000, 0)
	a := New(Options{Store: store, Prefix: "wal", PartialAfter: time.Second, Logger: zerolog.Nop(),
		Now: func() time.Time { return now }}, st)
	commit := start + 2*seg + 3*walstore.BlockSize + 77
	for i := 0; i < 2; i++ {
		got, err := a.Step(ctx, commit)
		if err != nil {
			t.Fatal(err)
		}
		if got != start+2*seg {
			t.Fatalf("archived %s, want %s", got, start+2*seg)
		}
		now = now.Add(2 * time.Second)
	}
	var buf bytes.Buffer
	name := walstore.SegmentName(1, uint64(start+2*seg)/seg, seg)
	if err := Fetch(ctx, store, "wal", 7, name, seg, &buf); err != nil {
		t.Fatal(err)
	}
	n := int(commit - start - 2*seg)
	if !bytes.Equal(buf.Bytes()[:n], wal[2*seg:2*seg+n]) || !bytes.Equal(buf.Bytes()[n:], make([]byte, seg-n)) {
		t.Fatalf("partial segment: not the WAL up to the commit LSN %s, then zeros", commit)
	}
	for p := start; p < start+2*seg; p += seg {
		buf.Reset()
		if err := Fetch(ctx, store, "wal", 7, walstore.SegmentName(1, uint64(p)/seg, seg), seg, &buf); err != nil || !bytes.Equal(buf.Bytes(), wal[p-start:p-start+seg]) {
			t.Fatalf("segment at %s: %v, or bytes that differ from the WAL", p, err)
		}
	}

	// Another member, whose copy of the first segment has a corrupt block.
	bad := group(t, 1, start, wal)[0]
	f, err := os.OpenFile(filepath.Join(bad.WALDir(), walstore.SegmentName(1, uint64(start)/seg, seg)), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^wal[seg-10]}, seg-10); err != nil {
		t.Fatal(err)
	}
	f.Close()
	empty := objectstore.NewMemory()
	b := New(Options{Store: empty, Prefix: "wal", Logger: zerolog.Nop()}, bad)
	if got, err := b.Step(ctx, commit); !errors.Is(err, walstore.ErrCorrupt) || got != start {
		t.Fatalf("archiving a corrupt segment: archived %s, %v; want %s and ErrCorrupt", got, err, start)
	}
	if _, err := empty.Stat(ctx, Key("wal", 7, walstore.SegmentName(1, uint64(start)/seg, seg), false)); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("the corrupt segment's object: %v, want none", err)
	}
}

// discardStore takes every Put into io.Discard: the archiver's own cost.
type discardStore struct{ objectstore.Store }

func (discardStore) Put(_ context.Context, _ string, r io.Reader, _ objectstore.PutOptions) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

func (discardStore) Stat(context.Context, string) (objectstore.ObjectInfo, error) {
	return objectstore.ObjectInfo{}, objectstore.ErrNotFound
}

func (discardStore) Delete(context.Context, string) error { return nil }

// BenchmarkArchiveSegment: reading and sending one 16 MiB segment (the
// store reads it back from the page cache and checks its checksums).
func BenchmarkArchiveSegment(b *testing.B) {
	const segSize = pg.WALSegmentSize
	st, err := walstore.Open(walstore.Options{Dir: b.TempDir(), NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const start = pg.LSN(segSize)
	if err := st.Init(start, 7, 1); err != nil {
		b.Fatal(err)
	}
	wal := make([]byte, 2*segSize)
	rand.New(rand.NewSource(1)).Read(wal)
	if err := st.Write(start, wal); err != nil {
		b.Fatal(err)
	}
	if _, err := st.Flush(); err != nil {
		b.Fatal(err)
	}
	a := New(Options{Store: discardStore{}, Logger: zerolog.Nop()}, st)
	ctl := st.Control()
	b.SetBytes(segSize)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a.inStore = map[uint64]bool{}
		if _, err := a.segment(context.Background(), ctl, start+pg.LSN(i%2)*segSize, false); err != nil {
			b.Fatal(err)
		}
	}
}

// TestArchiveToAnotherStore: a safekeeper restarted with another object
// store (the config changed, or the store was emptied) finds the last
// segment it counted archived missing and archives its local WAL again,
// so the new store holds it; before, it went on from its archived LSN and
// the new store never got the WAL below it. With the same store, nothing
// is uploaded again.
func TestArchiveToAnotherStore(t *testing.T) {
	ctx := context.Background()
	const start = pg.LSN(4 * seg)
	wal := make([]byte, 3*seg+100)
	rand.New(rand.NewSource(2)).Read(wal)
	end := start + pg.LSN(len(wal))
	st := group(t, 1, start, wal)[0]
	old := &countingStore{Store: objectstore.NewMemory(), puts: map[string]int{}}
	archived, err := New(Options{Store: old, Prefix: "wal", Logger: zerolog.Nop()}, st).Step(ctx, end)
	if err != nil || archived != start+3*seg {
		t.Fatalf("first store: archived %s, %v", archived, err)
	}
	// A restart with the same store uploads nothing again.
	if _, err := New(Options{Store: old, Prefix: "wal", Logger: zerolog.Nop()}, st).Step(ctx, end); err != nil {
		t.Fatal(err)
	}
	for k, n := range old.puts {
		if n != 1 {
			t.Fatalf("%s uploaded %d times to the same store", k, n)
		}
	}
	fresh := objectstore.NewMemory()
	archived, err = New(Options{Store: fresh, Prefix: "wal", Logger: zerolog.Nop()}, st).Step(ctx, end)
	if err != nil || archived != start+3*seg {
		t.Fatalf("new store: archived %s, %v", archived, err)
	}
	for no := uint64(start) / seg; no < uint64(start)/seg+3; no++ {
		key := Key("wal", 7, walstore.SegmentName(1, no, seg), false)
		rc, err := fresh.Get(ctx, key)
		if err != nil {
			t.Fatalf("segment %d in the new store: %v", no, err)
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		off := int(uint64(no)*seg - uint64(start))
		if !bytes.Equal(b, wal[off:off+seg]) {
			t.Fatalf("segment %d in the new store differs", no)
		}
	}
}

// TestFinalUploadsPartial: before PartialAfter of quiet, Step leaves the
// last segment out of the store; Final, the step of a stopping
// safekeeper, puts it at once. A member that stops with a shorter copy
// (a lower commit LSN) does not cut the one in the store.
func TestFinalUploadsPartial(t *testing.T) {
	ctx := context.Background()
	const start = pg.LSN(2 * seg)
	wal := make([]byte, seg+3*walstore.BlockSize)
	rand.New(rand.NewSource(3)).Read(wal)
	sts := group(t, 2, start, wal)
	store := objectstore.NewMemory()
	now := time.Unix(1000, 0)
	opts := Options{Store: store, Prefix: "wal", PartialAfter: time.Hour, Logger: zerolog.Nop(), Now: func() time.Time { return now }}
	a, b := New(opts, sts[0]), New(opts, sts[1])
	commit := start + seg + 2*walstore.BlockSize + 11
	name := walstore.SegmentName(1, uint64(start+seg)/seg, seg)
	key := Key("wal", 7, name, true)
	if _, err := a.Step(ctx, commit); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Stat(ctx, key); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("partial segment before its quiet time: %v, want none", err)
	}
	if got, err := a.Final(ctx, commit); err != nil || got != start+seg {
		t.Fatalf("Final: archived %s, %v", got, err)
	}
	var buf bytes.Buffer
	if err := Fetch(ctx, store, "wal", 7, name, seg, &buf); err != nil {
		t.Fatal(err)
	}
	n := int(commit - start - seg)
	if !bytes.Equal(buf.Bytes()[:n], wal[seg:seg+n]) || !bytes.Equal(buf.Bytes()[n:], make([]byte, seg-n)) {
		t.Fatalf("partial segment after Final: not the WAL up to the commit LSN %s, then zeros", commit)
	}
	if _, err := b.Final(ctx, commit-100); err != nil {
		t.Fatal(err)
	}
	if oi, err := store.Stat(ctx, key); err != nil || oi.Size != int64(n) {
		t.Fatalf("after a shorter member's Final: %d bytes, %v; want %d", oi.Size, err, n)
	}
}

// TestPartialEvery: commits every few seconds never leave PartialAfter of
// quiet; the segment's owner still uploads the partial segment every
// PartialEvery, up to the commit LSN of the time, so that the store is
// never far behind. Another member looks at the owner's copy as often and
// uploads nothing while it grows; when it stops growing (the owner is
// gone) for PartialEvery plus Takeover, that member uploads in its place.
// An owner without PartialEvery keeps to the quiet rule.
func TestPartialEvery(t *testing.T) {
	ctx := context.Background()
	const start = pg.LSN(3 * seg) // segment 3: rank 1 of 2 owns it
	wal := make([]byte, 3*walstore.BlockSize)
	rand.New(rand.NewSource(5)).Read(wal)
	sts := group(t, 4, start, wal)
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	shared := objectstore.NewMemory()
	type member struct {
		what  string
		a     *Archiver
		store *countingPuts
	}
	var ms []member
	for i, m := range []struct {
		what  string
		rank  int
		every time.Duration
		store objectstore.Store
	}{
		{"the owner", 1, time.Minute, shared},
		{"a member beside the owner", 0, time.Minute, shared},
		{"a member whose owner is gone", 0, time.Minute, objectstore.NewMemory()},
		{"the owner without PartialEvery", 1, 0, objectstore.NewMemory()},
	} {
		store := &countingPuts{Store: m.store}
		ms = append(ms, member{m.what, New(Options{Store: store, Prefix: "wal", PartialAfter: 10 * time.Second, PartialEvery: m.every,
			Rank: m.rank, GroupSize: 2, Takeover: 30 * time.Second, Logger: zerolog.Nop(), Now: clock}, sts[i]), store})
	}
	key := Key("wal", 7, walstore.SegmentName(1, uint64(start)/seg, seg), true)
	size := func(st objectstore.Store) int64 {
		oi, err := st.Stat(ctx, key)
		if errors.Is(err, objectstore.ErrNotFound) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return oi.Size
	}
	uploads := map[int][]int{} // member: the seconds it put the partial copy at
	for step := 0; step <= 30; step++ {
		commit := start + pg.LSN(500*(step+1)) // a commit every 5 s
		for i, m := range ms {
			before := m.store.puts.Load()
			if _, err := m.a.Step(ctx, commit); err != nil {
				t.Fatal(err)
			}
			if m.store.puts.Load() == before {
				continue
			}
			uploads[i] = append(uploads[i], step*5)
			if n := size(m.store); n != int64(commit-start) || m.a.PartialLSN() != commit {
				t.Fatalf("%s at %ds: %d bytes, PartialLSN %s; want the %d up to the commit LSN %s", m.what, step*5, n, m.a.PartialLSN(), commit-start, commit)
			}
		}
		now = now.Add(5 * time.Second)
	}
	want := map[int][]int{0: {60, 120}, 2: {120}}
	for i, m := range ms {
		if !slices.Equal(uploads[i], want[i]) {
			t.Errorf("%s put the partial copy at %v s over 150 s of commits every 5 s, want %v", m.what, uploads[i], want[i])
		}
	}
	// Quiet again: every member's rule still holds (the owner's copy
	// catches up after PartialAfter, the others' after PartialAfter plus
	// Takeover, unless the store holds as much by then).
	final := start + pg.LSN(500*32)
	for step := 0; step <= 9; step++ {
		for _, m := range ms {
			if _, err := m.a.Step(ctx, final); err != nil {
				t.Fatal(err)
			}
		}
		now = now.Add(5 * time.Second)
	}
	for _, m := range ms {
		if n := size(m.store); n != int64(final-start) {
			t.Errorf("%s: %d bytes of the partial segment after 45 s of quiet, want %d", m.what, n, final-start)
		}
	}
}

// countingPuts counts the Puts that reach a store.
type countingPuts struct {
	objectstore.Store
	puts atomic.Int64
}

func (c *countingPuts) Put(ctx context.Context, key string, r io.Reader, o objectstore.PutOptions) error {
	c.puts.Add(1)
	return c.Store.Put(ctx, key, r, o)
}

// slowPuts takes a few milliseconds for each Put, as a remote store does.
type slowPuts struct{ objectstore.Store }

func (s slowPuts) Put(ctx context.Context, key string, r io.Reader, o objectstore.PutOptions) error {
	time.Sleep(time.Duration(rand.Intn(8)) * time.Millisecond)
	return s.Store.Put(ctx, key, r, o)
}

// TestFinalConcurrent: the members of a group stop together, one of them
// with less WAL (a lower commit LSN), over a store whose Puts take a few
// milliseconds; whatever order they run in, the store ends with the
// longest copy of the partial segment. (Without the members' turns, the
// lagging member's Put lands last in some rounds.)
func TestFinalConcurrent(t *testing.T) {
	ctx := context.Background()
	const start = pg.LSN(2 * seg)
	wal := make([]byte, seg+3*walstore.BlockSize)
	rand.New(rand.NewSource(4)).Read(wal)
	commit := start + seg + 2*walstore.BlockSize + 11
	name := walstore.SegmentName(1, uint64(start+seg)/seg, seg)
	for round := 0; round < 20; round++ {
		sts := group(t, 3, start, wal)
		store := slowPuts{objectstore.NewMemory()}
		var wg sync.WaitGroup
		for rank, st := range sts {
			a := New(Options{Store: store, Prefix: "wal", PartialAfter: time.Hour, Rank: rank, GroupSize: 3,
				FinalStagger: 30 * time.Millisecond, Logger: zerolog.Nop()}, st)
			c := commit
			if rank == round%3 {
				c = commit - 500 // the lagging member
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := a.Final(ctx, c); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		oi, err := store.Stat(ctx, Key("wal", 7, name, true))
		if err != nil || oi.Size != int64(commit-start-seg) {
			t.Fatalf("round %d (member %d lagging): the partial copy holds %d bytes, %v; want %d", round, round%3, oi.Size, err, commit-start-seg)
		}
	}
}
