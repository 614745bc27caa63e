package walpos

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// TestFollowerOnRealWAL replays initdb's WAL into a folder the way
// Postgres writes it (whole pages, zero-padded past a record end, over a
// recycled segment) and checks that W, read by walking the folder, is
// exactly the last record end written after each write, and never past
// it while a write is only half there.
func TestFollowerOnRealWAL(t *testing.T) {
	seg, segStart, recs := realWAL(t)
	ends := recordEnds(recs)
	isEnd := map[pg.LSN]bool{}
	for _, e := range ends {
		isEnd[e] = true
	}

	dir := t.TempDir()
	path := filepath.Join(dir, "000000010000000000000001")
	rng := rand.New(rand.NewPCG(7, 8))
	old := recycled(seg, segStart, rng)
	if err := os.WriteFile(path, old, 0o600); err != nil {
		t.Fatal(err)
	}
	// A file of the next segment that is not written yet (recycled too).
	if err := os.WriteFile(filepath.Join(dir, "000000010000000000000002"), old, 0o600); err != nil {
		t.Fatal(err)
	}
	fh, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()

	tr := New(pg.WALSegmentSize, segStart)
	tr.Follow(dir, segStart)
	defer tr.Close()
	if got := tr.Current(); got != segStart {
		t.Fatalf("W before any write = %s, want %s", got, segStart)
	}
	written, w := 0, segStart // bytes of seg written; W so far
	torn := 0
	for i := 0; i < len(ends); {
		i = min(len(ends)-1, i+1+rng.IntN(20))
		e := ends[i]
		off := int(uint64(e) - uint64(segStart))
		first, last := written/PageSize, (off-1)/PageSize
		buf := bytes.Clone(seg[first*PageSize : (last+1)*PageSize])
		clear(buf[off-first*PageSize:]) // Postgres' WAL buffers are zero past the insert position
		if rng.IntN(3) == 0 {
			// Half a write: W stays a record end between the old W and e.
			k := rng.IntN(len(buf))
			if _, err := fh.WriteAt(buf[:k], int64(first*PageSize)); err != nil {
				t.Fatal(err)
			}
			got := tr.Current()
			if got < w || got > e || (got != w && !isEnd[got]) {
				t.Fatalf("half a write up to %s: W = %s (was %s)", e, got, w)
			}
			w = got
			torn++
		}
		if _, err := fh.WriteAt(buf, int64(first*PageSize)); err != nil {
			t.Fatal(err)
		}
		if got := tr.Current(); got != e {
			t.Fatalf("after writing WAL up to %s: W = %s", e, got)
		}
		w, written = e, off
		if i == len(ends)-1 {
			break
		}
	}
	if err := tr.FollowErr(); err != nil {
		t.Fatalf("FollowErr = %v", err)
	}
	walks, unwalked := tr.FollowStats()
	t.Logf("%d records, W reached %s, %d half writes, %d walks, %d lookups without one", len(ends), w, torn, walks, unwalked)
}

// TestFollowerWatch: a lookup that comes after no change in the folder
// reads nothing and answers the last walk's W; a write, a segment renamed
// into the folder and the folder moved away or made again each make the
// next lookup walk.
func TestFollowerWatch(t *testing.T) {
	seg, segStart, recs := realWAL(t)
	ends := recordEnds(recs)
	base := t.TempDir()
	dir := filepath.Join(base, "pg_wal")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	name := "000000010000000000000001"
	tr := New(pg.WALSegmentSize, segStart)
	tr.Follow(dir, segStart)
	defer tr.Close()
	stats := func() (int64, int64) { return tr.FollowStats() }
	// lookups makes n lookups, checks each answers want, and returns how
	// many walked.
	lookups := func(n int, want pg.LSN) int64 {
		t.Helper()
		w0, _ := stats()
		for range n {
			if got := tr.Current(); got != want {
				t.Fatalf("W = %s, want %s", got, want)
			}
		}
		w1, _ := stats()
		return w1 - w0
	}
	if walked := lookups(1, segStart); walked != 1 {
		t.Fatalf("first lookup: %d walks, want 1", walked)
	}
	if walked := lookups(10, segStart); walked != 0 {
		t.Fatalf("10 lookups of an unchanged, empty folder: %d walks", walked)
	}

	// The segment, written elsewhere, arrives by a rename (as Postgres
	// installs a new segment): the next lookup walks it.
	half := ends[len(ends)/2]
	off := int(uint64(half) - uint64(segStart))
	part := bytes.Clone(seg)
	clear(part[off:])
	tmp := filepath.Join(base, "xlogtemp")
	if err := os.WriteFile(tmp, part, 0o600); err != nil {
		t.Fatal(err)
	}
	if walked := lookups(3, segStart); walked != 0 {
		t.Fatalf("a file written outside the folder: %d walks", walked)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
	if walked := lookups(1, half); walked != 1 {
		t.Fatalf("lookup after the rename: %d walks", walked)
	}
	if walked := lookups(10, half); walked != 0 {
		t.Fatalf("10 lookups with no write: %d walks", walked)
	}

	// Each write, however small, makes the next lookup walk and reach the
	// last record it completes.
	fh, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	w := half
	for _, e := range ends[len(ends)/2+1 : len(ends)/2+40] {
		from, to := int(uint64(w)-uint64(segStart)), int(uint64(e)-uint64(segStart))
		if _, err := fh.WriteAt(seg[from:to], int64(from)); err != nil {
			t.Fatal(err)
		}
		if walked := lookups(1, e); walked != 1 {
			t.Fatalf("lookup after a write up to %s: %d walks", e, walked)
		}
		if walked := lookups(2, e); walked != 0 {
			t.Fatalf("lookups after the write's walk: %d walks", walked)
		}
		w = e
	}

	// The folder moved away: the watch has ended and every lookup walks
	// (the open segment still reads); a folder made under the name is
	// watched again.
	if err := os.Rename(dir, filepath.Join(base, "moved")); err != nil {
		t.Fatal(err)
	}
	if walked := lookups(3, w); walked != 3 {
		t.Fatalf("3 lookups with the folder gone: %d walks, want 3", walked)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if walked := lookups(1, w); walked != 1 {
		t.Fatalf("lookup after the folder came back: %d walks", walked)
	}
	if walked := lookups(5, w); walked != 0 {
		t.Fatalf("5 lookups in the new, unchanged folder: %d walks", walked)
	}
	_, unwalked := stats()
	t.Logf("%d lookups answered without a walk", unwalked)

	// After Close, a late lookup still answers and holds no new watch.
	tr.Close()
	if walked := lookups(2, w); walked != 2 {
		t.Fatalf("2 lookups after Close: %d walks, want 2", walked)
	}
	if tr.follow.watch != nil {
		t.Fatal("a lookup after Close made a new watch")
	}
}

// recycled returns what a recycled segment file holds where seg will be
// written: WAL-looking pages that name other LSNs, with garbage after
// their headers.
func recycled(seg []byte, segStart pg.LSN, rng *rand.Rand) []byte {
	old := make([]byte, len(seg))
	for i := range old {
		old[i] = byte(rng.Uint32())
	}
	for p := 0; p < len(old); p += PageSize {
		copy(old[p:], seg[p:p+shortHeaderSize])
		binary.LittleEndian.PutUint64(old[p+8:], uint64(segStart)+uint64(p)+3*pg.WALSegmentSize)
	}
	return old
}

// TestFollowerMissingFolder: a follower whose folder is gone keeps W and
// says why.
func TestFollowerMissingFolder(t *testing.T) {
	tr := New(pg.WALSegmentSize, 0x1000028)
	tr.Follow(filepath.Join(t.TempDir(), "gone"), 0x1000028)
	if got := tr.Current(); got != 0x1000028 {
		t.Fatalf("W = %s", got)
	}
	if tr.FollowErr() == nil {
		t.Fatal("no error for a missing folder")
	}
}

// TestFollowerNewCluster: a follower started at 0 (a new cluster) finds the
// first segment once initdb makes it.
func TestFollowerNewCluster(t *testing.T) {
	seg, segStart, _ := realWAL(t)
	dir := filepath.Join(t.TempDir(), "pg_wal")
	tr := New(pg.WALSegmentSize, 0)
	tr.Follow(dir, 0)
	defer tr.Close()
	if got := tr.Current(); got != 0 {
		t.Fatalf("W before initdb = %s", got)
	}
	if err := tr.FollowErr(); err != nil {
		t.Fatalf("FollowErr before initdb = %v", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "000000010000000000000001"), seg, 0o600); err != nil {
		t.Fatal(err)
	}
	if got := tr.Current(); got <= segStart {
		t.Fatalf("W after initdb = %s", got)
	}
}

// BenchmarkFollowerWalk prices one W lookup as the agent makes it before
// every page write it passes on: Postgres has written a few more records
// (whole pages, zero past the insert position) into a recycled segment,
// and Current walks them. initdb's WAL stands in for the workload's; each
// step writes the next 1-8 records.
func BenchmarkFollowerWalk(b *testing.B) {
	seg, segStart, recs := realWAL(b)
	ends := recordEnds(recs)
	dir := b.TempDir()
	path := filepath.Join(dir, "000000010000000000000001")
	rng := rand.New(rand.NewPCG(7, 8))
	old := recycled(seg, segStart, rng)
	fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer fh.Close()
	var tr *Tracker
	i, written, walked := 0, 0, 0
	restart := func() {
		if tr != nil {
			tr.Close()
		}
		if _, err := fh.WriteAt(old, 0); err != nil {
			b.Fatal(err)
		}
		tr = New(pg.WALSegmentSize, segStart)
		tr.Follow(dir, segStart)
		i, written = 0, 0
	}
	restart()
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		b.StopTimer()
		if i >= len(ends)-1 {
			restart()
		}
		i = min(len(ends)-1, i+1+rng.IntN(8))
		e := ends[i]
		off := int(uint64(e) - uint64(segStart))
		first, last := written/PageSize, (off-1)/PageSize
		buf := bytes.Clone(seg[first*PageSize : (last+1)*PageSize])
		clear(buf[off-first*PageSize:])
		if _, err := fh.WriteAt(buf, int64(first*PageSize)); err != nil {
			b.Fatal(err)
		}
		walked += off - written
		written = off
		b.StartTimer()
		if got := tr.Current(); got != e {
			b.Fatalf("W = %s, want %s", got, e)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(walked)/float64(b.N), "WAL-bytes/op")
	tr.Close()
}

// BenchmarkFollowerUnchanged prices a W lookup that comes when Postgres
// has written no WAL since the last one (most lookups under a bulk load):
// with the folder's inotify watch it reads no file; without it (a kernel
// that refuses the watch) it walks the end of WAL again.
func BenchmarkFollowerUnchanged(b *testing.B) {
	seg, segStart, recs := realWAL(b)
	ends := recordEnds(recs)
	for _, watch := range []bool{true, false} {
		b.Run(fmt.Sprintf("watch=%v", watch), func(b *testing.B) {
			dir := b.TempDir()
			end := ends[len(ends)/2]
			part := bytes.Clone(seg)
			clear(part[uint64(end)-uint64(segStart):])
			if err := os.WriteFile(filepath.Join(dir, "000000010000000000000001"), part, 0o600); err != nil {
				b.Fatal(err)
			}
			tr := New(pg.WALSegmentSize, segStart)
			tr.Follow(dir, segStart)
			defer tr.Close()
			tr.follow.noWatch = !watch
			if got := tr.Current(); got != end {
				b.Fatalf("W = %s, want %s", got, end)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if got := tr.Current(); got != end {
					b.Fatalf("W = %s, want %s", got, end)
				}
			}
		})
	}
}

// BenchmarkReadRecords prices the walk's record reading alone: initdb's
// WAL from memory, every record decoded (as the pageserver's ingest
// reads) or headers, length and CRC only (as the W lookup reads since
// wal.Reader.HeadersOnly).
func BenchmarkReadRecords(b *testing.B) {
	seg, segStart, _ := realWAL(b)
	for _, headers := range []bool{false, true} {
		b.Run(fmt.Sprintf("headers-only=%v", headers), func(b *testing.B) {
			n := 0
			for i := 0; i < b.N; i++ {
				r := wal.NewReader(&wal.BytesSource{Start: segStart, Data: seg}, segStart)
				if headers {
					r.HeadersOnly()
				}
				for {
					if _, err := r.Next(); err != nil {
						break
					}
					n++
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/record")
		})
	}
}

// TestFollowerWatchRefused: a follower whose folder the kernel will not
// watch (here a file in its place: ENOTDIR) says so once and walks at
// every lookup.
func TestFollowerWatchRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pg_wal")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tr := New(pg.WALSegmentSize, 0x1000028)
	tr.Follow(path, 0x1000028)
	defer tr.Close()
	var refusals []error
	tr.OnWatchRefused(func(err error) { refusals = append(refusals, err) })
	for range 5 {
		if got := tr.Current(); got != 0x1000028 {
			t.Fatalf("W = %s", got)
		}
	}
	if len(refusals) != 1 || !errors.Is(refusals[0], syscall.ENOTDIR) {
		t.Fatalf("refusals = %v, want one ENOTDIR", refusals)
	}
	if walks, unwalked := tr.FollowStats(); walks != 5 || unwalked != 0 {
		t.Fatalf("%d walks, %d lookups without one; want 5 and 0", walks, unwalked)
	}
}
