package psbackend_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/internal/pstest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// servePS runs a pageserver on dir, serving gRPC at addr; stop closes it.
func servePS(t *testing.T, dir, addr string, store objectstore.Store) (stop func()) {
	t.Helper()
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = dir
	_, stop = pstest.Serve(t, cfg, pageserver.Deps{Log: zerolog.Nop(), Store: store}, addr)
	return stop
}

// restartablePS serves a pageserver on a free port with timeline tl and
// returns a client of it and restart, which stops the pageserver, starts it
// again on the same data (a new incarnation) and waits until the client
// has reconnected.
func restartablePS(t *testing.T) (*client.Client, func()) {
	t.Helper()
	ctx := context.Background()
	dir, store := t.TempDir(), objectstore.NewMemory()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	stop := servePS(t, dir, addr, store)
	t.Cleanup(func() { stop() })
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	restart := func() {
		t.Helper()
		stop()
		stop = servePS(t, dir, addr, store)
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := c.ListTimelines(ctx); err == nil {
				return
			} else if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
	}
	return c, restart
}

// durableRel opens a Backend that commits its own writes
// (StandaloneCommit), creates rel with block 0 = page(1) at W 20 and syncs
// it: durable.
func durableRel(t *testing.T, c *client.Client, rel pg.RelTag) *psbackend.Backend {
	t.Helper()
	ctx := context.Background()
	b, err := psbackend.Open(ctx, c, tl, psbackend.Options{StandaloneCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.CreateRel(ctx, rel, 10); err != nil {
		t.Fatal(err)
	}
	if err := b.WritePage(ctx, rel.Page(0), page(1), 20); err != nil {
		t.Fatal(err)
	}
	if err := b.Sync(ctx, 20); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestLostOnPageserverRestart: versions the pageserver held pending (above
// the commit LSN) are gone after it restarts; the Backend notices the new
// incarnation and fails Sync and Send with ErrLost instead of reporting
// them durable. Versions that were durable before the restart are not a
// loss: a Backend whose writes were all durable goes on.
func TestLostOnPageserverRestart(t *testing.T) {
	ctx := context.Background()
	c, restart := restartablePS(t)
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16400}

	// clean: everything durable before the restart.
	clean := durableRel(t, c, rel)
	// dirty: one version left pending (W above the commit LSN).
	dirty, err := psbackend.Open(ctx, c, tl, psbackend.Options{SyncTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := dirty.WritePage(ctx, rel.Page(1), page(2), 500); err != nil {
		t.Fatal(err)
	}
	if err := dirty.Send(ctx); err != nil {
		t.Fatal(err)
	}
	if err := dirty.Lost(); err != nil {
		t.Fatalf("lost before any restart: %v", err)
	}

	restart()

	if err := dirty.Sync(ctx, 500); !errors.Is(err, psbackend.ErrLost) {
		t.Fatalf("Sync after the restart: %v, want ErrLost", err)
	}
	if err := dirty.Send(ctx); !errors.Is(err, psbackend.ErrLost) {
		t.Fatalf("Send after the restart: %v, want ErrLost", err)
	}
	// The durable page survived, and the clean Backend goes on.
	if err := clean.WritePage(ctx, rel.Page(2), page(3), 600); err != nil {
		t.Fatal(err)
	}
	if err := clean.Sync(ctx, 600); err != nil {
		t.Fatalf("clean Backend after the restart: %v", err)
	}
	buf := make([]byte, pg.BlockSize)
	fresh, err := psbackend.Open(ctx, c, tl, psbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.ReadPage(ctx, rel.Page(0), 0, buf); err != nil || buf[0] != 1 {
		t.Fatalf("durable page after the restart: %v %d", err, buf[0])
	}
}

// TestNoStaleReadAfterPageserverRestart: a page whose newest version the
// pageserver held pending is, after a pageserver restart, older there than
// what Postgres wrote. The Backend that wrote it must not hand that older
// version to Postgres: the read answer names the new incarnation, and the
// read fails with ErrLost, as does every later read (a page that did not
// exist before is not read as zeros either). A Backend with nothing pending
// reads on.
func TestNoStaleReadAfterPageserverRestart(t *testing.T) {
	ctx := context.Background()
	c, restart := restartablePS(t)
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16401}

	// Version 1 of block 0, durable.
	clean := durableRel(t, c, rel)
	// Version 2 of block 0 and a new block 1, pending; sent, so they are
	// out of the Backend's write buffer and a read goes to the pageserver.
	dirty, err := psbackend.Open(ctx, c, tl, psbackend.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := dirty.WritePage(ctx, rel.Page(0), page(2), 500); err != nil {
		t.Fatal(err)
	}
	if err := dirty.WritePage(ctx, rel.Page(1), page(3), 500); err != nil {
		t.Fatal(err)
	}
	if err := dirty.Send(ctx); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, pg.BlockSize)
	if err := dirty.ReadPage(ctx, rel.Page(0), 0, buf); err != nil || buf[0] != 2 {
		t.Fatalf("pending version before the restart: %v %d", err, buf[0])
	}

	restart()

	// The first contact after the restart is a read: the pageserver has
	// version 1 only.
	if err := dirty.ReadPage(ctx, rel.Page(0), 0, buf); !errors.Is(err, psbackend.ErrLost) {
		t.Fatalf("read of a page whose pending version was lost: %v (byte %d), want ErrLost", err, buf[0])
	}
	if err := dirty.ReadPage(ctx, rel.Page(1), 0, buf); !errors.Is(err, psbackend.ErrLost) {
		t.Fatalf("read of a page that was lost entirely: %v (byte %d), want ErrLost", err, buf[0])
	}
	if err := dirty.Sync(ctx, 500); !errors.Is(err, psbackend.ErrLost) {
		t.Fatalf("Sync after the restart: %v, want ErrLost", err)
	}
	// A Backend with nothing pending reads the durable version.
	if err := clean.ReadPage(ctx, rel.Page(0), 0, buf); err != nil || buf[0] != 1 {
		t.Fatalf("clean Backend after the restart: %v %d", err, buf[0])
	}
}
