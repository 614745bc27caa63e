// Package netfault cuts network paths for tests: a loopback TCP proxy
// that, on demand, keeps its connections open but answers nothing, as a
// network path that drops packets or a frozen server does. Tests only.
package netfault

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// Blackhole is a TCP proxy on 127.0.0.1 in front of a server that can cut
// the path without closing anything: once frozen, every connection
// open then (and every one made while frozen) swallows what it is sent and
// never answers again, as a network path that drops packets does; after
// thaw, new connections work.
type Blackhole struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	frozen bool
	conns  []*holeConn
}

type holeConn struct {
	dead      atomic.Bool
	down, up  net.Conn
	closeOnce sync.Once
}

func (h *holeConn) close() {
	h.closeOnce.Do(func() { h.down.Close(); h.up.Close() })
}

// Start starts a Blackhole in front of target (host:port) until t ends.
func Start(t testing.TB, target string) *Blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &Blackhole{ln: ln, target: target}
	go b.serve()
	t.Cleanup(func() {
		ln.Close()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, c := range b.conns {
			c.close()
		}
	})
	return b
}

// Addr is the proxy's host:port.
func (b *Blackhole) Addr() string { return b.ln.Addr().String() }

func (b *Blackhole) serve() {
	for {
		down, err := b.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", b.target)
		if err != nil {
			down.Close()
			continue
		}
		c := &holeConn{down: down, up: up}
		b.mu.Lock()
		c.dead.Store(b.frozen)
		b.conns = append(b.conns, c)
		b.mu.Unlock()
		go c.pipe(up, down)
		go c.pipe(down, up)
	}
}

// pipe copies src to dst until either ends; a dead connection's bytes
// are read and dropped.
func (h *holeConn) pipe(dst, src net.Conn) {
	defer h.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 && !h.dead.Load() {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Freeze cuts the path: every connection open now, or made until Thaw,
// swallows what it is sent and never answers.
func (b *Blackhole) Freeze() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frozen = true
	for _, c := range b.conns {
		c.dead.Store(true)
	}
}

// Thaw lets new connections through again (the frozen ones stay dead).
func (b *Blackhole) Thaw() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frozen = false
}
