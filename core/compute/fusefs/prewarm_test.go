package fusefs

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// seeded returns a Memory backend holding base/5/16384 with n pages, page i
// filled with byte 'a'+i.
func seeded(t *testing.T, n int) (*Memory, pg.RelTag) {
	t.Helper()
	ctx := context.Background()
	be := NewMemory()
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	for _, d := range []string{"base", "base/5"} {
		if err := be.Mkdir(ctx, d, 0o700, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.CreateRel(ctx, rel, 0); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if err := be.WritePage(ctx, rel.Page(uint32(i)), page(byte('a'+i)), 0); err != nil {
			t.Fatal(err)
		}
	}
	return be, rel
}

func TestPrewarm(t *testing.T) {
	e := newEnv(t)
	be, rel := seeded(t, 8)
	cache := NewMemCache(64)
	fsys := e.mount(t, be, cache)
	ctx := context.Background()

	keys := []pg.PageKey{rel.Page(0), rel.Page(3), rel.Page(7),
		rel.Page(8), // past the end
		pg.RelTag{Spc: 1663, DB: 5, Rel: 99}.Page(0)} // no such relation
	var calls int
	s, err := fsys.Prewarm(ctx, keys, 3, func(PrewarmStats) { calls++ })
	if err != nil {
		t.Fatal(err)
	}
	if s.Total != 5 || s.Loaded != 3 || s.Skipped != 2 || s.Cached != 0 || calls == 0 {
		t.Fatalf("prewarm: %+v (%d progress calls), want 3 loaded and 2 skipped", s, calls)
	}
	if cache.Len() != 3 {
		t.Fatalf("cache holds %d pages, want 3", cache.Len())
	}
	got := make([]byte, pg.BlockSize)
	if !cache.Get(rel.Page(3), got) || !bytes.Equal(got, page('d')) {
		t.Fatal("the prewarmed copy of block 3 differs from the backend's")
	}
	// Reading a prewarmed page through the mount is a cache hit.
	f, err := os.Open(filepath.Join(e.mnt, "base/5/16384"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hits := fsys.waits.hits.Load()
	if _, err := f.ReadAt(got, 7*pg.BlockSize); err != nil || !bytes.Equal(got, page('h')) {
		t.Fatalf("read of block 7: %v", err)
	}
	if fsys.waits.hits.Load() != hits+1 {
		t.Error("the read of a prewarmed page was not a cache hit")
	}
	// Again: everything is cached already.
	if s, err := fsys.Prewarm(ctx, keys[:3], 1, nil); err != nil || s.Cached != 3 {
		t.Errorf("second prewarm: %+v, %v; want 3 cached", s, err)
	}
}

// heldRead holds the ReadPage of one key until released.
type heldRead struct {
	*Memory
	key     pg.PageKey
	reading chan struct{} // closed when the gated read has begun
	release chan struct{}
	once    sync.Once
}

func (g *heldRead) ReadPage(ctx context.Context, key pg.PageKey, nms pg.LSN, page []byte) error {
	if key == g.key {
		// Read first, then wait: the copy is the one from before the
		// test's write.
		err := g.Memory.ReadPage(ctx, key, nms, page)
		g.once.Do(func() { close(g.reading) })
		<-g.release
		return err
	}
	return g.Memory.ReadPage(ctx, key, nms, page)
}

// TestPrewarmLosesRaceToWrite: Postgres writes a page while Prewarm reads
// the older copy of it; the older copy must not replace the written one in
// the cache (a later miss-free read would return the old page).
func TestPrewarmLosesRaceToWrite(t *testing.T) {
	e := newEnv(t)
	mem, rel := seeded(t, 4)
	be := &heldRead{Memory: mem, key: rel.Page(2), reading: make(chan struct{}), release: make(chan struct{})}
	cache := NewMemCache(64)
	fsys := e.mount(t, be, cache)

	done := make(chan PrewarmStats, 1)
	errc := make(chan error, 1)
	go func() {
		s, err := fsys.Prewarm(context.Background(), []pg.PageKey{rel.Page(2)}, 1, nil)
		done <- s
		errc <- err
	}()
	select {
	case <-be.reading:
	case <-time.After(30 * time.Second):
		t.Fatal("prewarm never read the page")
	}
	f, err := os.OpenFile(filepath.Join(e.mnt, "base/5/16384"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(page('Z'), 2*pg.BlockSize); err != nil {
		t.Fatal(err)
	}
	close(be.release)
	s := <-done
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if s.Skipped != 1 || s.Loaded != 0 {
		t.Errorf("prewarm: %+v, want the raced page skipped", s)
	}
	got := make([]byte, pg.BlockSize)
	if !cache.Get(rel.Page(2), got) || !bytes.Equal(got, page('Z')) {
		t.Fatalf("the cache holds %q..., want the written page", got[:4])
	}
}

// TestPrewarmStopsOnReadError: a backend failure ends the prewarm with the
// error, naming the page.
func TestPrewarmStopsOnReadError(t *testing.T) {
	e := newEnv(t)
	mem, rel := seeded(t, 4)
	fsys := e.mount(t, failingReads{mem}, NewMemCache(64))
	_, err := fsys.Prewarm(context.Background(), []pg.PageKey{rel.Page(0), rel.Page(1)}, 2, nil)
	if !errors.Is(err, errPageserverDown) {
		t.Fatalf("err = %v, want the backend's error", err)
	}
}

var errPageserverDown = errors.New("pageserver unreachable")

type failingReads struct{ *Memory }

func (failingReads) ReadPage(context.Context, pg.PageKey, pg.LSN, []byte) error {
	return errPageserverDown
}
