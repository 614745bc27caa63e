package objstore_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
	"github.com/stratadb/strata/plugins/objectstore/gcs/gcstest"
	"github.com/stratadb/strata/plugins/objectstore/s3/s3test"
	"github.com/stratadb/strata/sdk/objectstore"
)

// blackhole is a TCP proxy on 127.0.0.1 in front of an emulator that can
// cut the path without closing anything: once frozen, every connection
// open then (and every one made while frozen) swallows what it is sent and
// never answers again, as a network path that drops packets does; after
// thaw, new connections work.
type blackhole struct {
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

func startBlackhole(t *testing.T, target string) *blackhole {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &blackhole{ln: ln, target: target}
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

func (b *blackhole) addr() string { return b.ln.Addr().String() }

func (b *blackhole) serve() {
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

func (b *blackhole) freeze() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frozen = true
	for _, c := range b.conns {
		c.dead.Store(true)
	}
}

func (b *blackhole) thaw() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.frozen = false
}

// TestStallTimeoutOnEveryStore: with the path to the store cut while a Put
// waits (connections left open, nothing answered), the call fails after
// objectstore.stall_timeout, is retried, and succeeds once the path is
// back; without the timeout it would wait for the dead connection for as
// long as the kernel keeps it. Each cloud store, as objstore.Open opens it
// for the servers.
func TestStallTimeoutOnEveryStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup points c at the emulator through a blackhole it returns.
		setup func(t *testing.T, c *config.ObjectStore) *blackhole
	}{
		{"s3", func(t *testing.T, c *config.ObjectStore) *blackhole {
			gw := s3test.StartVersityGW(t)
			gw.SetEnv(t)
			u, _ := url.Parse(gw.Endpoint)
			b := startBlackhole(t, u.Host)
			c.S3 = gw.Config("stall", "p")
			c.S3.Endpoint = "http://" + b.addr()
			return b
		}},
		{"gcs", func(t *testing.T, c *config.ObjectStore) *blackhole {
			f := gcstest.StartFakeGCS(t)
			b := startBlackhole(t, f.Host)
			t.Setenv("STORAGE_EMULATOR_HOST", b.addr())
			c.GCS = f.Config("stall", "p")
			return b
		}},
		{"azure", func(t *testing.T, c *config.ObjectStore) *blackhole {
			az := azuretest.StartAzurite(t)
			u, _ := url.Parse(az.BlobEndpoint)
			b := startBlackhole(t, u.Host)
			c.Azure = az.Config("stall", "p")
			c.Azure.ConnectionString = strings.Replace(az.ConnectionString, u.Host, b.addr(), 1)
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default().ObjectStore
			c.Type = tc.name
			c.StallTimeout = time.Second
			b := tc.setup(t, &c)
			ctx := context.Background()
			st, err := objstore.Open(ctx, c, zerolog.Nop(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Put(ctx, "before", strings.NewReader("a"), objectstore.PutOptions{Size: 1}); err != nil {
				t.Fatal(err)
			}

			b.freeze()
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				done <- st.Put(ctx, "during", strings.NewReader("while the path was cut"), objectstore.PutOptions{Size: 22})
			}()
			time.Sleep(2500 * time.Millisecond)
			b.thaw()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the put through a cut path, retried after the path came back: %v", err)
				}
				t.Logf("the put waited %s (the path cut for 2.5 s, stall timeout 1 s)", time.Since(start).Round(100*time.Millisecond))
			case <-time.After(40 * time.Second):
				t.Fatal("the put still waits 40 s after the path was cut: the stall timeout did not end it")
			}
			rc, err := st.Get(ctx, "during")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, []byte("while the path was cut")) {
				t.Fatalf("read back %q, %v", got, err)
			}
		})
	}
}
