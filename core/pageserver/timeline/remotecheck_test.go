package timeline

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// putAndUpload writes pages from..to-1 (page i holds byte i, W = 100+i),
// flushes and uploads.
func putAndUpload(t *testing.T, tl *Timeline, from, to int) {
	t.Helper()
	ctx := context.Background()
	for i := from; i < to; i++ {
		if _, err := tl.PutPages(ctx, []PageWrite{{Page: rel.Page(uint32(i)), W: pg.LSN(100 + i), Data: page(byte(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
}

// checkPages reads pages 0..n-1 back from a timeline opened on an empty
// folder from the store alone.
func checkPages(t *testing.T, remote *manifest.Remote, id pg.TimelineID, commit *CommitLSN, n int) {
	t.Helper()
	tl := openT(t, t.TempDir(), commit, remote, id, nil, 0)
	defer tl.Close()
	for i := 0; i < n; i++ {
		got, err := tl.GetPage(context.Background(), rel.Page(uint32(i)), LatestLSN, 0)
		if err != nil || !bytes.Equal(got, page(byte(i))) {
			t.Fatalf("page %d from the store alone: %v", i, err)
		}
	}
}

// remoteRig returns what each test here starts from: a commit LSN above
// every write, timeline n, a folder for it and an object store.
func remoteRig(t *testing.T, n byte) (*CommitLSN, pg.TimelineID, string, *manifest.Remote) {
	commit := &CommitLSN{}
	commit.Set(1 << 40)
	return commit, pg.TimelineID{n}, t.TempDir(), &manifest.Remote{Store: objectstore.NewMemory()}
}

// TestUploadToAnotherStore: a pageserver restarted on its local state with
// another object store (the config changed, or the store was emptied)
// uploads every layer again, so the new store alone serves the timeline. It
// used to trust the local "uploaded" marks and publish manifests naming
// layers only the old store held.
func TestUploadToAnotherStore(t *testing.T) {
	commit, id, dir, oldStore := remoteRig(t, 7)
	a := openT(t, dir, commit, oldStore, id, nil, 0)
	putAndUpload(t, a, 0, 10)
	published := a.LSNs().RemoteConsistent
	a.Close()
	// With the same store, the check finds what was published: no new
	// generation, the same remote-consistent LSN.
	a = openT(t, dir, commit, oldStore, id, nil, 0)
	if err := a.Upload(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m, err := oldStore.Latest(context.Background(), id); err != nil || m.Generation != 1 || a.LSNs().RemoteConsistent != published {
		t.Fatalf("same store after a restart: generation %+v (%v), remote %s, want 1 and %s", m, err, a.LSNs().RemoteConsistent, published)
	}
	a.Close()

	newStore := &manifest.Remote{Store: objectstore.NewMemory()}
	a = openT(t, dir, commit, newStore, id, nil, 0)
	if rc := a.LSNs().RemoteConsistent; rc != 0 {
		t.Fatalf("before any upload to the new store, the remote-consistent LSN is %s", rc)
	}
	a.opts.MaxLocalBytes = 1
	if n := a.EvictCold(); n != 0 {
		t.Fatalf("evicted %d layers before the new store was checked", n)
	}
	putAndUpload(t, a, 10, 20)
	m, err := newStore.Latest(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := newStore.LayerSizes(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range m.Layers {
		if objs[d.Name] != d.Size {
			t.Errorf("the new store's manifest names %s (%d bytes), which it holds at %d bytes", d.Name, d.Size, objs[d.Name])
		}
	}
	a.Close()
	checkPages(t, newStore, id, commit, 20)
}

// TestUploadLayerLostEverywhere: a layer evicted from local disk (it was in
// the old store) cannot be uploaded to a new store; uploads fail with an
// error that says so, and the new store gets no manifest.
func TestUploadLayerLostEverywhere(t *testing.T) {
	commit, id, dir, oldStore := remoteRig(t, 8)
	a := openT(t, dir, commit, oldStore, id, nil, 0)
	putAndUpload(t, a, 0, 10)
	a.opts.MaxLocalBytes = 1
	if n := a.EvictCold(); n == 0 {
		t.Fatal("nothing evicted")
	}
	a.Close()

	newStore := &manifest.Remote{Store: objectstore.NewMemory()}
	a = openT(t, dir, commit, newStore, id, nil, 0)
	defer a.Close()
	err := a.Upload(context.Background())
	if err == nil || !strings.Contains(err.Error(), "neither on local disk nor in the object store") {
		t.Fatalf("upload with layers lost everywhere: %v", err)
	}
	if _, err := newStore.Latest(context.Background(), id); !errors.Is(err, manifest.ErrNoManifest) {
		t.Fatalf("the new store got a manifest: %v", err)
	}
	// Pointed back at the old store, it goes on.
	a.Close()
	a = openT(t, dir, commit, oldStore, id, nil, 0)
	putAndUpload(t, a, 10, 20)
	a.Close()
	checkPages(t, oldStore, id, commit, 20)
}

// TestCrashBetweenPublishAndSave: a pageserver killed after publishing a
// manifest and before saving it locally comes back with the older
// generation; the store's newer one names only its layers, so it is
// adopted and the next upload publishes after it (it used to collide with
// it and fence the timeline for good).
func TestCrashBetweenPublishAndSave(t *testing.T) {
	commit, id, dir, store := remoteRig(t, 9)
	a := openT(t, dir, commit, store, id, nil, 0)
	putAndUpload(t, a, 0, 10)
	for i := 10; i < 15; i++ {
		if _, err := a.PutPages(context.Background(), []PageWrite{{Page: rel.Page(uint32(i)), W: pg.LSN(100 + i), Data: page(byte(i))}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Upload(context.Background()); err != nil {
		t.Fatal(err)
	}
	a.Close()
	if err := os.WriteFile(filepath.Join(dir, manifestFile), before, 0o644); err != nil {
		t.Fatal(err)
	}
	a = openT(t, dir, commit, store, id, nil, 0)
	putAndUpload(t, a, 15, 20)
	a.Close()
	m, err := store.Latest(context.Background(), id)
	if err != nil || m.Generation != 3 {
		t.Fatalf("latest manifest: %v %+v", err, m)
	}
	checkPages(t, store, id, commit, 20)
}

// TestFencedAtRestart: a pageserver restarted after another one took the
// timeline over (the store's newer manifest names layers it does not
// have) refuses to open it, before it serves any of its older pages,
// saying to move its folder away; once it is, the timeline opens from the
// store with the newer pages. A timeline already open when the other
// pageserver publishes is fenced at its next upload (TestFencingAndEviction).
func TestFencedAtRestart(t *testing.T) {
	commit, id, dir, store := remoteRig(t, 10)
	a := openT(t, dir, commit, store, id, nil, 0)
	putAndUpload(t, a, 0, 10)
	a.Close()
	b := openT(t, t.TempDir(), commit, store, id, nil, 0)
	putAndUpload(t, b, 10, 20)
	b.Close()
	listing := func() string {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, e := range ents {
			fi, _ := e.Info()
			fmt.Fprintf(&b, "%s %d %v\n", e.Name(), fi.Size(), fi.ModTime())
		}
		return b.String()
	}
	before := listing()
	_, err := Open(context.Background(), id, dir, smallOpts(), Deps{Log: zerolog.Nop(), Commit: commit, Remote: store})
	if !errors.Is(err, manifest.ErrFenced) || !strings.Contains(err.Error(), "move it away") {
		t.Fatalf("reopening the older copy: %v; want ErrFenced saying to move the folder away", err)
	}
	if after := listing(); after != before {
		t.Fatalf("the refused open changed the older copy:\n%s\nwas\n%s", after, before)
	}
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	a = openT(t, dir, commit, store, id, nil, 0)
	defer a.Close()
	for i := 0; i < 20; i++ {
		if got, err := a.GetPage(context.Background(), rel.Page(uint32(i)), LatestLSN, 0); err != nil || !bytes.Equal(got, page(byte(i))) {
			t.Fatalf("page %d from the store after the folder was moved away: %v", i, err)
		}
	}
	checkPages(t, store, id, commit, 20)
}
