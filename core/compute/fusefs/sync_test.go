package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
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

// mountGated mounts opts over a gatedBackend on e; the cleanup releases
// the backend and unmounts.
func mountGated(t *testing.T, e *mountEnv, opts Options) (*gatedBackend, *FS) {
	t.Helper()
	be := &gatedBackend{Memory: NewMemory(), release: make(chan struct{})}
	opts.Backend, opts.WALScratch, opts.UID, opts.GID, opts.Log = be, e.scratch, e.uid, e.gid, zerolog.Nop()
	f, err := Mount(context.Background(), e.mnt, opts)
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
	return be, f
}

// TestSendOnlySync: while the mount is in send-only mode (Postgres in crash
// recovery), fsync returns once the mutations are sent, without waiting for
// durability; after SetSyncDurable(true) fsync waits until the Backend says
// the writes are durable.
func TestSendOnlySync(t *testing.T) {
	e := newEnv(t)
	be, f := mountGated(t, e, Options{SendOnlySync: true})
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

// TestSendOnlyPath: with durable fsync on, a file and a folder named by
// Options.SendOnlyPath are answered once sent (a safekeeper's slot, whose
// creation must not wait for a quorum that needs this safekeeper), after a
// rename into the named path too, while every other fsync still waits.
func TestSendOnlyPath(t *testing.T) {
	e := newEnv(t)
	be, _ := mountGated(t, e, Options{
		SendOnlyPath: func(p string) bool { return p == "slots" || strings.HasPrefix(p, "slots/") },
	})
	syncs := func(path string) chan error {
		done := make(chan error, 1)
		go func() {
			fh, err := os.Open(path)
			if err != nil {
				done <- err
				return
			}
			defer fh.Close()
			done <- fh.Sync()
		}()
		return done
	}
	returns := func(what string, done chan error) {
		t.Helper()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s waited for durability", what)
		}
	}
	for _, d := range []string{"slots", "other"} {
		if err := os.Mkdir(filepath.Join(e.mnt, d), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(e.mnt, d, "state"), []byte("slot"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	returns("fsync of a named folder", syncs(filepath.Join(e.mnt, "slots")))
	returns("fsync of a named file", syncs(filepath.Join(e.mnt, "slots", "state")))
	if err := os.Rename(filepath.Join(e.mnt, "other", "state"), filepath.Join(e.mnt, "slots", "moved")); err != nil {
		t.Fatal(err)
	}
	returns("fsync of a file renamed into a named folder", syncs(filepath.Join(e.mnt, "slots", "moved")))
	if be.syncs.Load() != 0 || be.sends.Load() != 3 {
		t.Fatalf("named paths: syncs %d, sends %d; want 0 and 3", be.syncs.Load(), be.sends.Load())
	}
	if err := os.WriteFile(filepath.Join(e.mnt, "other", "state"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(e.mnt, "other", "state"), filepath.Join(e.mnt, "other")} {
		done := syncs(p)
		select {
		case err := <-done:
			t.Fatalf("fsync of %s returned before durability: %v", p, err)
		case <-time.After(300 * time.Millisecond):
		}
		defer func() { returns("fsync after release", done) }()
	}
	close(be.release)
}

// TestRenameFolder: a folder holding files is renamed as Postgres renames a
// new replication slot (pg_replslot/<name>.tmp to pg_replslot/<name>); the
// files move with it, in storage too (a remount sees them), and folders
// that hold subfolders answer EXDEV.
func TestRenameFolder(t *testing.T) {
	e := newEnv(t)
	be := NewMemory()
	e.mount(t, be, nil)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(e.mnt, "pg_replslot"), 0o700))
	tmp := filepath.Join(e.mnt, "pg_replslot", "strata_sk1.tmp")
	must(os.Mkdir(tmp, 0o700))
	must(os.WriteFile(filepath.Join(tmp, "state.tmp"), []byte("slot state"), 0o600))
	must(os.Rename(filepath.Join(tmp, "state.tmp"), filepath.Join(tmp, "state")))
	final := filepath.Join(e.mnt, "pg_replslot", "strata_sk1")
	must(os.Rename(tmp, final))
	if b, err := os.ReadFile(filepath.Join(final, "state")); err != nil || string(b) != "slot state" {
		t.Fatalf("after rename: %q %v", b, err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatalf("old folder still there: %v", err)
	}
	// A file created in the renamed folder lands under its new path.
	must(os.WriteFile(filepath.Join(final, "extra"), []byte("x"), 0o600))
	if _, err := be.ReadFile(context.Background(), "pg_replslot/strata_sk1/extra", 0, make([]byte, 1)); err != nil {
		t.Fatalf("new file in the renamed folder: %v", err)
	}
	// Renaming over a folder with files fails.
	must(os.Mkdir(filepath.Join(e.mnt, "pg_replslot", "other"), 0o700))
	if err := os.Rename(filepath.Join(e.mnt, "pg_replslot", "other"), final); err == nil {
		t.Fatal("rename over a folder with files succeeded")
	}
	// A folder with a subfolder is not renamed.
	must(os.MkdirAll(filepath.Join(e.mnt, "nest", "sub"), 0o700))
	if err := os.Rename(filepath.Join(e.mnt, "nest"), filepath.Join(e.mnt, "nest2")); err == nil {
		t.Fatal("rename of a folder with a subfolder succeeded")
	}
	// Storage holds the new layout: a second mount sees it.
	e2 := &mountEnv{root: e.root, mnt: filepath.Join(e.root, "data2"), scratch: e.scratch, uid: e.uid, gid: e.gid}
	must(os.Mkdir(e2.mnt, 0o700))
	e2.mount(t, be, nil)
	if b, err := os.ReadFile(filepath.Join(e2.mnt, "pg_replslot", "strata_sk1", "state")); err != nil || string(b) != "slot state" {
		t.Fatalf("second mount: %q %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(e2.mnt, "pg_replslot", "strata_sk1.tmp")); !os.IsNotExist(err) {
		t.Fatalf("second mount has the old folder: %v", err)
	}
}
