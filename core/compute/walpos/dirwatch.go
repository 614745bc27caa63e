package walpos

import (
	"encoding/binary"
	"errors"

	"golang.org/x/sys/unix"
)

// watchMask is every change to the followed folder that can change what a
// walk finds: a write to a segment (IN_MODIFY, which a truncate raises
// too), a segment that appears, goes or takes another's name, and the
// folder itself going away.
const watchMask = unix.IN_MODIFY | unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// A dirWatch tells whether anything in a folder changed since it last
// looked, by inotify. The kernel queues a write's event before the write
// returns, so once Postgres' WAL write has returned (and with it, before
// any page write that depends on that WAL reaches the agent), its event is
// there to read: a folder that reports no event since the last walk holds
// exactly what that walk read.
type dirWatch struct {
	fd     int
	broken bool // the watch is gone (the folder was removed or moved): make a new one
	buf    []byte
}

// newDirWatch watches dir. The error is the kernel's (ENOENT for a folder
// not made yet, EMFILE or ENOSPC at the inotify limits).
func newDirWatch(dir string) (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if _, err := unix.InotifyAddWatch(fd, dir, watchMask|unix.IN_ONLYDIR); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &dirWatch{fd: fd, buf: make([]byte, 4096)}, nil
}

// changed reads every event queued since the last call and reports
// whether there was any. A queue that overflowed counts as a change; a
// watch that ended (its folder removed or moved, or a read that failed)
// does too, and is marked broken.
func (w *dirWatch) changed() bool {
	seen := false
	for {
		n, err := unix.Read(w.fd, w.buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			return seen
		}
		if err != nil || n <= 0 {
			w.broken = true
			return true
		}
		seen = true
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			mask := binary.NativeEndian.Uint32(w.buf[off+4:])
			if mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0 {
				w.broken = true
			}
			off += unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(w.buf[off+12:]))
		}
	}
}

func (w *dirWatch) close() { unix.Close(w.fd) }
