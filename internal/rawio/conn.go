package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// conn is a socket whose reads and writes are raw non-blocking system
// calls; the runtime's network poller waits for readiness, so deadlines and
// Close unblock them as they do any net.Conn's.
type conn struct {
	net.Conn
	rc syscall.RawConn
}

// WrapConn returns c with raw reads and writes, or c itself when it has no
// file descriptor (it is not a syscall.Conn: a TLS or in-memory connection).
// Wrap the socket under a TLS layer, not the layer.
func WrapConn(c net.Conn) net.Conn {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &conn{Conn: c, rc: rc}
}

func (c *conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			r, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case unix.EINTR:
				continue
			case unix.EAGAIN:
				return false // the poller waits for data
			}
			n, errno = int(r), e
			return true
		}
	})
	if err != nil {
		return 0, err
	}
	if errno != 0 {
		return 0, c.opError("read", errno)
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

func (c *conn) Write(p []byte) (int, error) {
	var done int
	var errno syscall.Errno
	err := c.rc.Write(func(fd uintptr) bool {
		for done < len(p) {
			r, _, e := unix.RawSyscall(unix.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[done])), uintptr(len(p)-done))
			switch e {
			case 0:
				done += int(r)
			case unix.EINTR:
			case unix.EAGAIN:
				return false // the poller waits for room
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err != nil {
		return done, err
	}
	if errno != 0 {
		return done, c.opError("write", errno)
	}
	return done, nil
}

func (c *conn) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(),
		Err: os.NewSyscallError(op, errno)}
}

// WrapListener returns l whose accepted connections have raw reads and
// writes (WrapConn).
func WrapListener(l net.Listener) net.Listener { return listener{l} }

type listener struct{ net.Listener }

func (l listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return WrapConn(c), nil
}
