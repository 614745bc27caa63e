// Package rawio makes the system calls of a hot I/O loop (the safekeeper's
// WAL writes and flushes, its replication socket) without the Go runtime's
// system-call bookkeeping.
//
// Why. A system call made the usual way (syscall.Syscall, os.File, net.Conn)
// tells the scheduler that it may block: the runtime's monitor thread
// (sysmon) is woken if it slept, polls every 20 us while calls are under
// way, and hands the caller's P to another thread when a call outlasts one
// of its ticks; the caller then waits for a P on its return. A process that
// wakes for each few WAL records, makes a few short calls and one disk
// flush, and sleeps again pays several thread wake-ups per flush, and on a
// virtual machine every one is a trip through the hypervisor. In a
// safekeeper that was about a quarter of its CPU (docs/benchmarks.md). A raw
// call (syscall.RawSyscall) keeps its P and wakes nobody: with GOMAXPROCS=1
// the whole process waits for it, as a single-threaded C program would.
//
// What it is not for: calls that can block for long. A raw call cannot be
// preempted, so a disk that stalls would stall every goroutine that shares
// the P (the gRPC service, the metrics). Guard therefore times each raw
// file call and, after a slow one, sends the calls of a cool-down period
// the usual way. Socket calls here are non-blocking (the runtime's network
// poller still does the waiting, and deadlines hold), so they need no guard.
package rawio

import (
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Defaults of a Guard's zero fields.
const (
	DefaultSlow     = 100 * time.Millisecond
	DefaultCooldown = 10 * time.Second
)

// Guard makes file system calls raw while they are quick. A raw call that
// takes longer than Slow sends the calls of the next Cooldown the usual way,
// so that a stalled disk stalls that one call's P and not, call after call,
// everything else on it.
//
// A nil *Guard makes every call the usual way. The zero Guard is ready to
// use. A Guard is safe for concurrent use; set its fields before first use.
type Guard struct {
	// Slow is the duration past which a raw call counts as slow (default
	// DefaultSlow).
	Slow time.Duration
	// Cooldown is how long the calls after a slow one go the usual way
	// (default DefaultCooldown).
	Cooldown time.Duration
	// OnSlow, when set, is called (from the caller's goroutine) after each
	// slow raw call, with the call's name and duration.
	OnSlow func(op string, took time.Duration)

	until atomic.Int64 // unix nanoseconds until which calls go the usual way
	slow  atomic.Uint64
}

// SlowCalls returns how many raw calls were slow so far.
func (g *Guard) SlowCalls() uint64 {
	if g == nil {
		return 0
	}
	return g.slow.Load()
}

// raw reports whether the next call goes raw, and the time it starts.
func (g *Guard) raw() (bool, time.Time) {
	if g == nil {
		return false, time.Time{}
	}
	now := time.Now()
	return now.UnixNano() >= g.until.Load(), now
}

// done records a raw call that started at start.
func (g *Guard) done(op string, start time.Time) {
	took := time.Since(start)
	slow := g.Slow
	if slow <= 0 {
		slow = DefaultSlow
	}
	if took <= slow {
		return
	}
	cool := g.Cooldown
	if cool <= 0 {
		cool = DefaultCooldown
	}
	g.until.Store(time.Now().Add(cool).UnixNano())
	g.slow.Add(1)
	if g.OnSlow != nil {
		g.OnSlow(op, took)
	}
}

// control runs fn with f's descriptor, which stays open until fn returns
// (a concurrent Close waits).
func control(f *os.File, fn func(fd uintptr)) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(fn)
}

// WriteAt writes b to f at off, as f.WriteAt does (the error is an
// *os.PathError; a short write comes with the error that stopped it).
func (g *Guard) WriteAt(f *os.File, b []byte, off int64) (int, error) {
	raw, start := g.raw()
	if !raw || len(b) == 0 {
		return f.WriteAt(b, off)
	}
	var done int
	var errno syscall.Errno
	err := control(f, func(fd uintptr) {
		for done < len(b) {
			n, _, e := unix.RawSyscall6(unix.SYS_PWRITE64, fd, uintptr(unsafe.Pointer(&b[done])),
				uintptr(len(b)-done), uintptr(off+int64(done)), 0, 0)
			if e == unix.EINTR {
				continue
			}
			if e != 0 {
				errno = e
				return
			}
			if n == 0 {
				errno = unix.EIO // no progress and no error: do not spin
				return
			}
			done += int(n)
		}
	})
	g.done("pwrite", start)
	if err != nil {
		return done, &os.PathError{Op: "write", Path: f.Name(), Err: err}
	}
	if errno != 0 {
		return done, &os.PathError{Op: "write", Path: f.Name(), Err: errno}
	}
	return done, nil
}

// SyncFileRange is sync_file_range(2) on f. The error is the bare errno,
// as from unix.SyncFileRange (ENOSYS, EINVAL, ESPIPE where the file
// system has none).
func (g *Guard) SyncFileRange(f *os.File, off, n int64, flags int) error {
	return g.sync(f, "sync_file_range", func(fd uintptr, raw bool) error {
		if !raw {
			return unix.SyncFileRange(int(fd), off, n, flags)
		}
		_, _, e := unix.RawSyscall6(unix.SYS_SYNC_FILE_RANGE, fd, uintptr(off), uintptr(n), uintptr(flags), 0, 0)
		return errnoErr(e)
	})
}

// Fdatasync is fdatasync(2) on f. The error is the bare errno, as from
// unix.Fdatasync.
func (g *Guard) Fdatasync(f *os.File) error {
	return g.sync(f, "fdatasync", func(fd uintptr, raw bool) error {
		if !raw {
			return unix.Fdatasync(int(fd))
		}
		_, _, e := unix.RawSyscall(unix.SYS_FDATASYNC, fd, 0, 0)
		return errnoErr(e)
	})
}

// sync runs call on f's descriptor, raw or not as the guard says, and
// retries it when a signal interrupted it.
func (g *Guard) sync(f *os.File, op string, call func(fd uintptr, raw bool) error) error {
	raw, start := g.raw()
	var err error
	if cerr := control(f, func(fd uintptr) {
		for {
			if err = call(fd, raw); err != unix.EINTR {
				return
			}
		}
	}); cerr != nil {
		return cerr
	}
	if raw {
		g.done(op, start)
	}
	return err
}

func errnoErr(e syscall.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
