// Package pacedwrite writes large files (the pageserver's layer files, the
// local object store's objects) so that the disk's queue never fills with
// them: as each chunk of a file is written, the kernel is asked to start
// writing it back, and the writer waits until the chunk before it is on
// the disk. Without it a file of a gigabyte sits in the page cache until
// its fsync, and that fsync's burst makes every small synchronous write on
// the same disk (the safekeepers' WAL flushes, which every commit waits
// for) wait behind it: tens of milliseconds, against a few with pacing and
// the same bulk throughput (BenchmarkCommitUnderBulkWrite,
// docs/benchmarks.md).
//
// Pacing does not make a file durable: the caller still fsyncs it. An
// error of the writeback it started is returned by the Write that waits
// for it, as the kernel reports a writeback error to one caller only.
package pacedwrite

import (
	"errors"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Chunk is how many bytes of a file go to the kernel's writeback at a
// time; at most two chunks are in flight.
const Chunk = 4 << 20

// A Writer writes to a file sequentially from the file's offset when New
// was called, pacing its writeback. It is not safe for concurrent use.
type Writer struct {
	f     *os.File
	chunk int64
	start int64 // the file offset of the first byte written through w
	n     int64 // bytes written through w
	sent  int64 // bytes handed to writeback (a multiple of chunk)
	plain bool  // the file does not support sync_file_range: write only
}

// New returns a Writer that writes to f from f's current offset.
func New(f *os.File) *Writer { return newChunk(f, Chunk) }

func newChunk(f *os.File, chunk int64) *Writer {
	w := &Writer{f: f, chunk: chunk}
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil {
		w.plain = true // not a seekable file: nothing to pace
	}
	w.start = off
	return w
}

// Write writes p to the file, then hands every whole chunk written since
// the last call to writeback and waits for the chunk before it.
func (w *Writer) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.n += int64(n)
	if err != nil {
		return n, err
	}
	for !w.plain && w.n-w.sent >= w.chunk {
		if err := w.pace(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// pace starts the writeback of the next chunk and waits for the one
// before it.
func (w *Writer) pace() error {
	fd := int(w.f.Fd())
	at := w.start + w.sent
	if err := unix.SyncFileRange(fd, at, w.chunk, unix.SYNC_FILE_RANGE_WRITE); err != nil {
		if unsupported(err) {
			w.plain = true
			return nil
		}
		return &os.PathError{Op: "sync_file_range", Path: w.f.Name(), Err: err}
	}
	if w.sent >= w.chunk {
		const wait = unix.SYNC_FILE_RANGE_WAIT_BEFORE | unix.SYNC_FILE_RANGE_WRITE | unix.SYNC_FILE_RANGE_WAIT_AFTER
		if err := unix.SyncFileRange(fd, at-w.chunk, w.chunk, wait); err != nil {
			return &os.PathError{Op: "sync_file_range", Path: w.f.Name(), Err: err}
		}
	}
	w.sent += w.chunk
	return nil
}

// unsupported reports whether err says that the file cannot be paced (a
// pipe, a filesystem without the call), as opposed to a failed write.
func unsupported(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.ESPIPE) ||
		errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)
}
