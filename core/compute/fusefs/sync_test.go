package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/pg"
)

// gatedBackend is a Memory whose Sync blocks until released (durability
// that does not come), and which counts Sends.
type gatedBackend struct {
	*Memory
	release chan struct{}
	syncs   atomic.Int32
	sends   atomic.Int32
}

func (g *gatedBackend) Sync(ctx context.Context, w pg.LSN) error {
	g.syncs.Add(1)
	select {
	case <-g.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return g.Memory.Sync(ctx, w)
}

func (g *gatedBackend) Send(context.Context) error {
	g.sends.Add(1)
	return nil
}

// TestSendOnlySync: while the mount is in send-only mode (Postgres in crash
// recovery), fsync returns once the mutations are sent, without waiting for
// durability; after SetSyncDurable(true) fsync waits until the Backend says
// the writes are durable.
func TestSendOnlySync(t *testing.T) {
	e := newEnv(t)
	be := &gatedBackend{Memory: NewMemory(), release: make(chan struct{})}
	f, err := Mount(context.Background(), e.mnt, Options{
		Backend: be, WALScratch: e.scratch, UID: e.uid, GID: e.gid, SendOnlySync: true, Log: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-be.release:
		default:
			close(be.release)
		}
		if mounted(e.mnt) {
			f.Unmount()
		}
		MountpointCleanup(e.mnt)
	})
	if f.SyncDurable() {
		t.Fatal("SendOnlySync mount reports durable fsync")
	}
	p := filepath.Join(e.mnt, "pg_control_like")
	fh, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt([]byte("state"), 0); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- fh.Sync() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("send-only fsync waited")
	}
	if be.sends.Load() != 1 || be.syncs.Load() != 0 || f.Waits().SendOnlyFsyncs() != 1 {
		t.Fatalf("sends %d, syncs %d, counted %d", be.sends.Load(), be.syncs.Load(), f.Waits().SendOnlyFsyncs())
	}

	f.SetSyncDurable(true)
	go func() { done <- fh.Sync() }()
	select {
	case err := <-done:
		t.Fatalf("durable fsync returned before durability: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(be.release)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("durable fsync did not return once durable")
	}
	if be.syncs.Load() != 1 || be.sends.Load() != 1 {
		t.Fatalf("sends %d, syncs %d", be.sends.Load(), be.syncs.Load())
	}
}
