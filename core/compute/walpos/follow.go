package walpos

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// A Follower finds W by reading the WAL that Postgres writes into a local
// folder (pg_wal as a symlink out of the mount, so that WAL writes never
// cross FUSE). Each Current call walks the records written since the last
// one and moves W to the end of the last complete, valid record: the page
// headers must name their own LSN, each record's back link must point to
// the record before it, and each record's CRC must hold.
//
// Why a walk and not the write's end: the folder is read while Postgres
// writes it, so a read may see half of a write. A record that was complete
// before the caller's data write reached the agent is stable (Postgres
// rewrites the last WAL page whole, but with the same bytes for the records
// already on it), so W never misses it; a record being written fails its
// CRC and is picked up by a later call. Pages of a recycled segment fail
// the page address check.
//
// Most lookups come between two WAL writes and would read the same bytes
// as the one before (two pages at the end of WAL, and during a bulk load a
// look for the next segment in the folder). An inotify watch on the folder
// says whether anything was written, created, removed or renamed in it
// since the last walk; when nothing was, the walk's answer stands and the
// lookup reads no file. Where the watch cannot be made, every lookup walks.
type Follower struct {
	dir     string
	segSize uint64

	mu    sync.Mutex
	next  pg.LSN // where the next record starts: the last record end found
	prev  pg.LSN // start of the last record found (0 before the first)
	files map[uint64]*os.File
	r     *wal.Reader // reset to next at every walk (its buffers are kept)
	err   error       // the last error other than the end of WAL, for Err

	watch    *dirWatch   // nil: none (yet, or none can be made)
	noWatch  bool        // the kernel refused a watch, or Close ran: walk every time
	refused  func(error) // told of the kernel's refusal (OnWatchRefused)
	armed    bool        // the last walk ran, without error, under the watch
	walks    int64       // walks made
	unwalked int64       // lookups answered without a walk
}

// Follow makes t follow the WAL written into dir from start (a record end:
// the durable end of WAL the compute was started from). From then on
// Current walks dir first.
func (t *Tracker) Follow(dir string, start pg.LSN) {
	t.follow = &Follower{dir: dir, segSize: t.segSize, next: start, files: map[uint64]*os.File{}}
	t.Advance(start)
}

// FollowErr returns the last error (other than reaching the end of the WAL
// written so far) that stopped a walk of the followed folder, or nil.
func (t *Tracker) FollowErr() error {
	if t.follow == nil {
		return nil
	}
	t.follow.mu.Lock()
	defer t.follow.mu.Unlock()
	return t.follow.err
}

// Close closes the files and the folder watch the tracker holds open.
func (t *Tracker) Close() {
	if t.follow == nil {
		return
	}
	t.follow.mu.Lock()
	defer t.follow.mu.Unlock()
	for no, f := range t.follow.files {
		f.Close()
		delete(t.follow.files, no)
	}
	if w := t.follow.watch; w != nil {
		w.close()
		t.follow.watch, t.follow.armed = nil, false
	}
	t.follow.noWatch = true // a lookup after Close makes no new watch
}

// OnWatchRefused sets fn to be called (once, with the follower's lock
// held: fn must not call the tracker) when the kernel refuses the
// folder's inotify watch, after which every lookup walks.
func (t *Tracker) OnWatchRefused(fn func(error)) {
	if t.follow == nil {
		return
	}
	t.follow.mu.Lock()
	defer t.follow.mu.Unlock()
	t.follow.refused = fn
}

// FollowStats returns the number of W lookups that walked the followed
// folder and of those answered without a walk (nothing changed in the
// folder since the walk before).
func (t *Tracker) FollowStats() (walks, unwalked int64) {
	if t.follow == nil {
		return 0, 0
	}
	t.follow.mu.Lock()
	defer t.follow.mu.Unlock()
	return t.follow.walks, t.follow.unwalked
}

// quiet reports whether nothing changed in the folder since the last walk,
// which then still holds. It makes the watch when there is none: that
// lookup walks (what was written before the watch existed is unknown).
// REQUIRES: f.mu held.
func (f *Follower) quiet() bool {
	if f.noWatch {
		return false
	}
	if f.watch != nil && f.watch.broken {
		f.watch.close()
		f.watch, f.armed = nil, false
	}
	if f.watch == nil {
		w, err := newDirWatch(f.dir)
		if err != nil {
			// A folder not made yet gets its watch later; any other
			// refusal (inotify's limits) leaves this follower walking.
			if !errors.Is(err, syscall.ENOENT) {
				f.noWatch = true
				if f.refused != nil {
					f.refused(err)
				}
			}
			return false
		}
		f.watch = w
		return false
	}
	changed := f.watch.changed()
	return f.armed && !changed && !f.watch.broken
}

// walk reads the records written since the last walk and returns the end
// of the last one.
func (f *Follower) walk() pg.LSN {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.quiet() {
		f.unwalked++
		return f.next
	}
	f.walks++
	f.armed = false
	defer func() { f.armed = f.watch != nil && f.err == nil }()
	if f.next == 0 {
		// A new cluster (initdb): its WAL starts at its first segment.
		no, ok, err := f.firstSegment()
		if err != nil || !ok {
			f.err = err
			return 0
		}
		f.next = pg.LSN(no * f.segSize)
	}
	if f.r == nil {
		f.r = wal.NewReader(followSource{f}, f.next)
		f.r.HeadersOnly() // W needs record ends, not what the records change
	} else {
		f.r.Reset(f.next)
	}
	r := f.r
	for {
		rec, err := r.Next()
		if err != nil {
			if !errors.Is(err, wal.ErrEndOfWAL) && !errors.Is(err, wal.ErrCorrupt) {
				f.err = err
			}
			// ErrCorrupt is the normal end here too: a record still being
			// written (its CRC does not hold yet).
			break
		}
		if f.prev != 0 && rec.Prev != f.prev {
			break // not the record that follows ours: left over, not written yet
		}
		f.prev, f.next = rec.LSN, rec.EndLSN
		f.err = nil
	}
	f.dropBefore(uint64(f.next) / f.segSize)
	return f.next
}

// firstSegment returns the lowest segment number in the folder.
func (f *Follower) firstSegment() (uint64, bool, error) {
	ents, err := os.ReadDir(f.dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, false, nil // initdb has not made it yet
		}
		return 0, false, err
	}
	var first uint64
	found := false
	for _, e := range ents {
		if s, err := ParseSegmentName(e.Name(), f.segSize); err == nil && (!found || s.SegNo < first) {
			first, found = s.SegNo, true
		}
	}
	return first, found, nil
}

// dropBefore closes the files of segments before no: W never goes back.
func (f *Follower) dropBefore(no uint64) {
	for n, fh := range f.files {
		if n < no {
			fh.Close()
			delete(f.files, n)
		}
	}
}

// file returns the open file of segment no: the one on the highest
// timeline when several exist (after a promotion).
func (f *Follower) file(no uint64) (*os.File, error) {
	if fh, ok := f.files[no]; ok {
		return fh, nil
	}
	ents, err := os.ReadDir(f.dir)
	if err != nil {
		return nil, err
	}
	best, found := "", false
	for _, e := range ents {
		s, err := ParseSegmentName(e.Name(), f.segSize)
		if err != nil || s.SegNo != no {
			continue
		}
		if !found || e.Name() > best {
			best, found = e.Name(), true
		}
	}
	if !found {
		return nil, fmt.Errorf("%w: segment %d not in %s", wal.ErrEndOfWAL, no, f.dir)
	}
	fh, err := os.Open(filepath.Join(f.dir, best))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%w: %v", wal.ErrEndOfWAL, err)
		}
		return nil, err
	}
	f.files[no] = fh
	return fh, nil
}

// stale reports whether fh is no longer the file named for its segment (a
// refill or a recycle put another file under the name).
func stale(fh *os.File) bool {
	var a, b syscall.Stat_t
	if syscall.Fstat(int(fh.Fd()), &a) != nil || syscall.Stat(fh.Name(), &b) != nil {
		return true
	}
	return a.Ino != b.Ino || a.Dev != b.Dev
}

// followSource reads single WAL pages from the followed folder (no read
// ahead: the pages at the end of WAL change between walks).
type followSource struct{ f *Follower }

func (s followSource) SegmentSize() uint64 { return s.f.segSize }

func (s followSource) ReadPage(lsn pg.LSN, buf []byte) error {
	no := uint64(lsn) / s.f.segSize
	for try := 0; ; try++ {
		fh, err := s.f.file(no)
		if err != nil {
			return err
		}
		n, err := fh.ReadAt(buf, int64(uint64(lsn)%s.f.segSize))
		if err == nil || n == len(buf) {
			// A page that is not WAL for lsn may come from a file that was
			// replaced under its name: look again once.
			if try == 0 && !validPage(buf, lsn) && stale(fh) {
				fh.Close()
				delete(s.f.files, no)
				continue
			}
			return nil
		}
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%w: %s is shorter than a segment", wal.ErrEndOfWAL, fh.Name())
		}
		return err
	}
}

// validPage reports whether p's header is a Postgres 15 WAL page header for
// the page at lsn.
func validPage(p []byte, lsn pg.LSN) bool {
	return len(p) >= shortHeaderSize && binary.LittleEndian.Uint16(p[0:2]) == PageMagic &&
		pg.LSN(binary.LittleEndian.Uint64(p[8:16])) == lsn
}
