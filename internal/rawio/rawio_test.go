package rawio

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratadb/strata/internal/smallfs"
)

func tempFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(t.TempDir(), "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestWriteAt: raw and usual writes land where asked, and both sync calls
// succeed on a regular file.
func TestWriteAt(t *testing.T) {
	for _, g := range []*Guard{{}, nil} {
		f := tempFile(t)
		big := make([]byte, 3<<20+5)
		rand.Read(big)
		if n, err := g.WriteAt(f, big, 4096); n != len(big) || err != nil {
			t.Fatalf("guard %v: WriteAt: %d, %v", g != nil, n, err)
		}
		if n, err := g.WriteAt(f, []byte("hello"), 1); n != 5 || err != nil {
			t.Fatalf("guard %v: WriteAt: %d, %v", g != nil, n, err)
		}
		if err := g.SyncFileRange(f, 0, 0, unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER); err != nil {
			t.Fatalf("guard %v: SyncFileRange: %v", g != nil, err)
		}
		if err := g.Fdatasync(f); err != nil {
			t.Fatalf("guard %v: Fdatasync: %v", g != nil, err)
		}
		got, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, 4096+len(big))
		copy(want[1:], "hello")
		copy(want[4096:], big)
		if !bytes.Equal(got, want) {
			t.Fatalf("guard %v: file content differs from what was written", g != nil)
		}
		if g.SlowCalls() != 0 {
			// Not impossible on a very busy machine, but 100 ms per call
			// would be.
			t.Logf("guard %v: %d slow calls", g != nil, g.SlowCalls())
		}
	}
}

// TestErrors: the errors are what the usual calls give: a PathError with
// the errno for writes (ENOSPC on a full disk, with the bytes that fit
// counted), the bare errno for the sync calls, and no panic on a closed
// file.
func TestErrors(t *testing.T) {
	g := &Guard{}
	dir := smallfs.Mount(t, 256<<10)
	f, err := os.OpenFile(filepath.Join(dir, "f"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n, err := g.WriteAt(f, make([]byte, 1<<20), 0)
	var pe *os.PathError
	if !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &pe) || pe.Path != f.Name() {
		t.Fatalf("WriteAt on a full disk: %d, %v; want a PathError with ENOSPC", n, err)
	}
	if n <= 0 || n >= 1<<20 {
		t.Fatalf("WriteAt on a full disk wrote %d bytes; want the part that fit", n)
	}

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	if err := g.SyncFileRange(w, 0, 0, unix.SYNC_FILE_RANGE_WRITE); err != unix.ESPIPE {
		t.Fatalf("SyncFileRange on a pipe: %v; want the bare ESPIPE", err)
	}
	if err := g.Fdatasync(w); err != unix.EINVAL {
		t.Fatalf("Fdatasync on a pipe: %v; want the bare EINVAL", err)
	}

	c := tempFile(t)
	c.Close()
	if _, err := g.WriteAt(c, []byte("x"), 0); err == nil {
		t.Fatal("WriteAt on a closed file: no error")
	}
	if err := g.Fdatasync(c); err == nil {
		t.Fatal("Fdatasync on a closed file: no error")
	}
}

// TestGuardCooldown: a raw call slower than Slow is reported and sends the
// calls of the cool-down the usual way (which are then not timed, so they
// are not reported either).
func TestGuardCooldown(t *testing.T) {
	var ops []string
	g := &Guard{Slow: time.Nanosecond, Cooldown: time.Hour, OnSlow: func(op string, took time.Duration) {
		if took <= 0 {
			t.Errorf("OnSlow(%s, %v): want a positive duration", op, took)
		}
		ops = append(ops, op)
	}}
	f := tempFile(t)
	if err := g.Fdatasync(f); err != nil {
		t.Fatal(err)
	}
	if g.SlowCalls() != 1 || len(ops) != 1 || ops[0] != "fdatasync" {
		t.Fatalf("after a slow call: SlowCalls %d, OnSlow %v; want 1, [fdatasync]", g.SlowCalls(), ops)
	}
	for i := 0; i < 3; i++ {
		if _, err := g.WriteAt(f, []byte("x"), 0); err != nil {
			t.Fatal(err)
		}
		if err := g.Fdatasync(f); err != nil {
			t.Fatal(err)
		}
	}
	if g.SlowCalls() != 1 || len(ops) != 1 {
		t.Fatalf("in the cool-down: SlowCalls %d, OnSlow %v; want the calls made the usual way", g.SlowCalls(), ops)
	}

	// Past the cool-down, calls go raw again.
	g.until.Store(time.Now().Add(-time.Second).UnixNano())
	if _, err := g.WriteAt(f, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if g.SlowCalls() != 2 || len(ops) != 2 || ops[1] != "pwrite" {
		t.Fatalf("after the cool-down: SlowCalls %d, OnSlow %v; want the write raw (and slow) again", g.SlowCalls(), ops)
	}
}

func connPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln = WrapListener(ln)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err = ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	client = WrapConn(c)
	if _, ok := client.(*conn); !ok {
		t.Fatalf("WrapConn(%T) = %T; want a raw conn", c, client)
	}
	if _, ok := server.(*conn); !ok {
		t.Fatalf("WrapListener's Accept = %T; want a raw conn", server)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestConn: bytes cross intact both ways, a writer faster than its reader
// waits for room, the peer's close reads as io.EOF.
func TestConn(t *testing.T) {
	client, server := connPair(t)
	data := make([]byte, 16<<20) // more than the socket buffers hold
	rand.Read(data)
	var wg sync.WaitGroup
	wg.Add(1)
	var werr error
	var wn int
	go func() {
		defer wg.Done()
		wn, werr = client.Write(data)
		client.Close()
	}()
	time.Sleep(50 * time.Millisecond) // let the writer fill the buffers
	got, err := io.ReadAll(server)
	wg.Wait()
	if err != nil || werr != nil || wn != len(data) {
		t.Fatalf("read %d bytes (%v), wrote %d (%v)", len(got), err, wn, werr)
	}
	if !bytes.Equal(got, data) {
		t.Fatal("bytes read differ from bytes written")
	}
	if n, err := server.Write([]byte("late")); err == nil {
		// The client closed; the first write may still succeed (RST comes
		// back later), a later one fails.
		time.Sleep(50 * time.Millisecond)
		if _, err = server.Write([]byte("later")); err == nil {
			t.Fatalf("writes to a closed peer succeed (%d bytes)", n)
		}
	}
}

// TestConnDeadlineAndClose: the poller still waits for raw reads, so a read
// deadline and a Close from another goroutine end a blocked Read.
func TestConnDeadlineAndClose(t *testing.T) {
	client, _ := connPair(t)
	client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	buf := make([]byte, 10)
	if _, err := client.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline: %v; want os.ErrDeadlineExceeded", err)
	}
	client.SetReadDeadline(time.Time{})
	errc := make(chan error, 1)
	go func() {
		_, err := client.Read(buf)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	client.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read after Close: %v; want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a blocked Read")
	}
}

// TestWrapConnWithoutFD: a connection with no file descriptor is returned
// as it is.
func TestWrapConnWithoutFD(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if w := WrapConn(a); w != a {
		t.Fatalf("WrapConn(net.Pipe) = %T; want the pipe itself", w)
	}
}
