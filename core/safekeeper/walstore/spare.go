package walstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// A segment's data file is written zeros, never fallocated: on ext4 and XFS
// a write into a fallocated (unwritten) extent changes the extent map, so
// the fdatasync of every Flush that reaches a new block also commits the
// filesystem journal, a second device write and cache flush (measured on
// ext4: 0.44-0.48 ms per 8 KiB write and fdatasync against 0.19-0.21 ms on
// written zeros). Postgres zero-fills its WAL segments for the same reason
// (wal_init_zero).
//
// Writing 16 MiB of zeros when a Write crosses into a new segment would
// stall that Write, so a background goroutine keeps one spare segment
// ready: written zeros, synced, under spareName in the store's folder
// (outside pg_wal, so nothing that lists segments sees it). A new segment
// takes the spare with a rename; only when none is ready (the first
// segment, or WAL arriving faster than the disk writes zeros) is the
// segment zero-filled in the Write.

const (
	spareName    = "spare-segment"
	spareTmpName = "spare-segment.tmp"
	zeroChunk    = 1 << 20
)

// startSpare starts the goroutine that keeps a spare segment ready.
func (s *Store) startSpare() {
	s.spareWant = make(chan struct{}, 1)
	s.spareStop = make(chan struct{})
	s.spareDone = make(chan struct{})
	final := filepath.Join(s.opts.Dir, spareName)
	os.Remove(filepath.Join(s.opts.Dir, spareTmpName)) // a crash while writing one
	if st, err := os.Stat(final); err == nil && st.Size() == int64(s.segSize) {
		s.spareReady = true
	} else {
		os.Remove(final)
	}
	s.wantSpare()
	go s.keepSpare()
}

// stopSpare stops the goroutine and waits for it (no-op if not started).
func (s *Store) stopSpare() {
	if s.spareStop == nil {
		return
	}
	s.spareOnce.Do(func() { close(s.spareStop) })
	<-s.spareDone
}

func (s *Store) wantSpare() {
	select {
	case s.spareWant <- struct{}{}:
	default:
	}
}

func (s *Store) keepSpare() {
	defer close(s.spareDone)
	for {
		select {
		case <-s.spareStop:
			return
		case <-s.spareWant:
		}
		s.mu.Lock()
		ready := s.spareReady
		s.mu.Unlock()
		if ready {
			continue
		}
		if err := s.makeSpare(); err != nil {
			if errors.Is(err, errSpareStopped) {
				return
			}
			// A full disk, say: new segments are zero-filled in the Write
			// meanwhile (and fail there with the same error).
			s.opts.Logger.Warn().Err(err).Msg("walstore: preparing a spare segment failed; retrying in 10s")
			select {
			case <-s.spareStop:
				return
			case <-time.After(10 * time.Second):
			}
			s.wantSpare()
			continue
		}
		s.mu.Lock()
		s.spareReady = true
		s.mu.Unlock()
	}
}

var errSpareStopped = errors.New("walstore: store closing")

// makeSpare writes a segment of zeros under the temporary name, syncs it
// and renames it to spareName.
func (s *Store) makeSpare() error {
	tmp := filepath.Join(s.opts.Dir, spareTmpName)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("walstore: spare segment: %w", err)
	}
	err = zeroFill(f, int64(s.segSize), s.spareStop)
	if err == nil && !s.opts.NoSync {
		err = datasync(nil, f) // long (a whole segment): the usual call
	}
	f.Close()
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.opts.Dir, spareName))
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// takeSpare moves the ready spare segment to path, if there is one, and
// asks for the next one. Without a spare, path stays absent and the caller
// zero-fills the new segment. REQUIRES: s.mu held.
func (s *Store) takeSpare(path string) {
	defer s.wantSpare()
	if !s.spareReady {
		return
	}
	s.spareReady = false
	if err := os.Rename(filepath.Join(s.opts.Dir, spareName), path); err != nil {
		s.opts.Logger.Warn().Err(err).Msg("walstore: taking the spare segment failed; zero-filling the new segment")
	}
}

// zeroFill makes f size bytes of written zeros (unless it is that long),
// 1 MiB at a time. A close of stop (nil: never) between two writes ends it
// with errSpareStopped.
func zeroFill(f *os.File, size int64, stop <-chan struct{}) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("walstore: %w", err)
	}
	zero := make([]byte, min(zeroChunk, size))
	for off := st.Size(); off < size; off += int64(len(zero)) {
		select {
		case <-stop:
			return errSpareStopped
		default:
		}
		n := min(int64(len(zero)), size-off)
		if _, err := f.WriteAt(zero[:n], off); err != nil {
			return fmt.Errorf("zero-fill: %w", err)
		}
	}
	return nil
}
