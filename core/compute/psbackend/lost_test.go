package psbackend_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/server"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// servePS runs a pageserver on dir, serving gRPC at addr; stop closes it.
func servePS(t *testing.T, dir, addr string, store objectstore.Store) (stop func()) {
	t.Helper()
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = dir
	reg := prometheus.NewRegistry()
	ps, err := pageserver.New(context.Background(), cfg, pageserver.Deps{Log: zerolog.Nop(), Registry: reg, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	for i := 0; ; i++ {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if i > 50 {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(256 << 20))
	server.New(ps, zerolog.Nop(), reg).Register(g)
	go g.Serve(lis)
	return func() { g.Stop(); ps.Close() }
}

// TestLostOnPageserverRestart: versions the pageserver held pending (above
// the commit LSN) are gone after it restarts; the Backend notices the new
// incarnation and fails Sync and Send with ErrLost instead of reporting
// them durable. Versions that were durable before the restart are not a
// loss: a Backend whose writes were all durable goes on.
func TestLostOnPageserverRestart(t *testing.T) {
	ctx := context.Background()
	dir, store := t.TempDir(), objectstore.NewMemory()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	stop := servePS(t, dir, addr, store)
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16400}

	// clean: everything durable before the restart.
	clean, err := psbackend.Open(ctx, c, tl, psbackend.Options{StandaloneCommit: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := clean.CreateRel(ctx, rel, 10); err != nil {
		t.Fatal(err)
	}
	if err := clean.WritePage(ctx, rel.Page(0), page(1), 20); err != nil {
		t.Fatal(err)
	}
	if err := clean.Sync(ctx, 20); err != nil {
		t.Fatal(err)
	}
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

	stop()
	stop = servePS(t, dir, addr, store)
	defer stop()
	// Wait until the client has reconnected.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := c.ListTimelines(ctx); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}

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
