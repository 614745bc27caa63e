package manifest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/pg"
)

func TestPublishRaceExactlyOneWins(t *testing.T) {
	ctx := context.Background()
	r := &Remote{Store: objectstore.NewMemory()}
	tl := pg.TimelineID{1}
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins, fenced := 0, 0
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			err := r.Publish(ctx, tl, &Manifest{Version: 1, Timeline: tl.String(), Generation: 1, DiskConsistentLSN: pg.LSN(i)})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				wins++
			case errors.Is(err, ErrFenced):
				fenced++
			default:
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if wins != 1 || fenced != 7 {
		t.Fatalf("wins %d fenced %d", wins, fenced)
	}
	if err := r.Publish(ctx, tl, &Manifest{Generation: 2, DiskConsistentLSN: 99}); err != nil {
		t.Fatal(err)
	}
	m, err := r.Latest(ctx, tl)
	if err != nil || m.Generation != 2 || m.DiskConsistentLSN != 99 {
		t.Fatalf("latest: %+v %v", m, err)
	}
	if _, err := r.Latest(ctx, pg.TimelineID{2}); !errors.Is(err, ErrNoManifest) {
		t.Fatalf("missing timeline: %v", err)
	}
	ids, err := r.Timelines(ctx)
	if err != nil || len(ids) != 1 || ids[0] != tl {
		t.Fatalf("timelines %v %v", ids, err)
	}
	if err := r.PruneManifests(ctx, tl, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Store.Stat(ctx, ManifestKey(tl, 1)); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatal("old manifest not pruned")
	}
}

func TestUploadDownloadAndLocal(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r := &Remote{Store: objectstore.NewMemory(), Parallel: 2}
	tl := pg.TimelineID{3}
	var descs []layer.Desc
	for i := 0; i < 5; i++ {
		vs := []layer.Version{{Key: keyspace.FileMeta("f"), LSN: pg.LSN(i + 1), Seq: uint64(i + 1), Kind: layer.Image, Data: []byte{byte(i)}}}
		d, err := layer.WriteFile(dir, layer.DeltaLayer, vs, keyspace.Range{}, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		descs = append(descs, d)
	}
	var mu sync.Mutex
	done := 0
	if err := r.UploadLayers(ctx, tl, dir, descs, func(string) { mu.Lock(); done++; mu.Unlock() }); err != nil || done != 5 {
		t.Fatalf("upload: %v, %d done", err, done)
	}
	dst := filepath.Join(t.TempDir(), descs[2].Name)
	if err := r.Download(ctx, tl, descs[2], dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(filepath.Join(dir, descs[2].Name))
	b, _ := os.ReadFile(dst)
	if string(a) != string(b) {
		t.Fatal("downloaded bytes differ")
	}
	bad := descs[2]
	bad.Size++
	if err := r.Download(ctx, tl, bad, dst+"x"); err == nil {
		t.Fatal("size mismatch not detected")
	}
	m := &Manifest{Version: 1, Timeline: tl.String(), Generation: 4, Layers: descs}
	p := filepath.Join(dir, "manifest.json")
	if err := SaveLocal(p, m); err != nil {
		t.Fatal(err)
	}
	got, err := LoadLocal(p)
	if err != nil || len(got.Layers) != 5 || got.Layers[1].Keys != descs[1].Keys {
		t.Fatalf("local manifest: %v", err)
	}
	if _, err := Decode([]byte(`{"layers":[{"name":"../x","key_start":"` + keyspace.Key{}.String() + `","key_end":"` + keyspace.MaxKey.String() + `"}]}`)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("bad layer name accepted: %v", err)
	}
	if err := r.DeleteLayers(ctx, tl, []string{descs[0].Name}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Store.Stat(ctx, LayerKey(tl, descs[0].Name)); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatal("layer not deleted")
	}
	// A layer the manifest names but the store no longer has: an error
	// that says so, and nothing written.
	gone := filepath.Join(t.TempDir(), descs[0].Name)
	if err := r.Download(ctx, tl, descs[0], gone); !errors.Is(err, objectstore.ErrNotFound) || !strings.Contains(err.Error(), "layer "+descs[0].Name+" of timeline "+tl.String()+" is gone from the object store") {
		t.Fatalf("download of a deleted layer: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(gone)); len(ents) != 0 {
		t.Fatalf("download of a deleted layer left %d files", len(ents))
	}
}

// TestSameContent: the time of writing does not count; every other field,
// down to a layer's uploaded flag, does.
func TestSameContent(t *testing.T) {
	mk := func() *Manifest {
		return &Manifest{Version: 1, Timeline: "t", Generation: 3, DiskConsistentLSN: 100, GCCutoff: 50, MaxSeq: 9,
			Layers:    []layer.Desc{{Name: "a", LSNStart: 1, LSNEnd: 100, Size: 10}},
			WrittenAt: time.Unix(1, 0)}
	}
	a, b := mk(), mk()
	b.WrittenAt = time.Unix(2, 0)
	if !a.SameContent(b) {
		t.Fatal("manifests that differ only in WrittenAt differ")
	}
	for name, change := range map[string]func(m *Manifest){
		"cutoff":   func(m *Manifest) { m.GCCutoff++ },
		"dcl":      func(m *Manifest) { m.DiskConsistentLSN++ },
		"gen":      func(m *Manifest) { m.Generation++ },
		"seq":      func(m *Manifest) { m.MaxSeq++ },
		"uploaded": func(m *Manifest) { m.Layers[0].Uploaded = true },
		"layers":   func(m *Manifest) { m.Layers = append(m.Layers, layer.Desc{Name: "b"}) },
	} {
		b := mk()
		change(b)
		if a.SameContent(b) {
			t.Errorf("%s: a change was not seen", name)
		}
	}
	if a.SameContent(nil) || !(*Manifest)(nil).SameContent(nil) {
		t.Error("nil handling")
	}
}

// TestPublishRetriedCreate: a manifest create that landed but reported a
// transient failure is retried by objectstore.WithRetry, whose second
// attempt finds the object (ErrExists): it is this manifest, so Publish
// succeeds instead of fencing the pageserver. Another manifest of that
// generation still fences.
func TestPublishRetriedCreate(t *testing.T) {
	ctx := context.Background()
	lost := faulty.New(objectstore.NewMemory(), faulty.Config{Rules: []faulty.Rule{{Ops: faulty.OpPut, Fault: faulty.FailReply, Transient: true, Times: 1}}})
	r := &Remote{Store: objectstore.WithRetry(lost, objectstore.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}, zerolog.Nop())}
	tl := pg.TimelineID{4}
	m := &Manifest{Version: 1, Timeline: tl.String(), Generation: 1, DiskConsistentLSN: 100}
	if err := r.Publish(ctx, tl, m); err != nil || lost.Fired() != 1 {
		t.Fatalf("publish through a create that landed and reported a failure: %v (%d faults)", err, lost.Fired())
	}
	if got, err := r.Latest(ctx, tl); err != nil || !got.SameContent(m) {
		t.Fatalf("latest: %+v, %v", got, err)
	}
	other := &Manifest{Version: 1, Timeline: tl.String(), Generation: 1, DiskConsistentLSN: 200}
	if err := r.Publish(ctx, tl, other); !errors.Is(err, ErrFenced) {
		t.Fatalf("another manifest of generation 1: %v, want ErrFenced", err)
	}
}
