package timeline

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// errLayerGone: the layer was removed from the map while a reader used an
// older snapshot; the reader retries with a fresh one.
var errLayerGone = errors.New("timeline: layer removed")

// handle is a layer file of the timeline: its description, whether a local
// copy exists, and an open reader. The reader is opened on first use,
// downloading the file from the object store if the local copy is missing
// (on-demand fetch), and closed when the layer is evicted or deleted.
type handle struct {
	t    *Timeline
	desc layer.Desc

	mu       sync.RWMutex // RLock while reading through r; Lock to open/evict/delete
	r        *layer.Reader
	f        *os.File
	mm       []byte // the file mapped read-only (nil: read with pread)
	uploaded bool
	gone     bool

	lastUse atomic.Int64

	// keysIn remembers hasKeyIn's answers: the file never changes, and the
	// image plan asks the same question of each delta file every
	// background round.
	keysMu sync.Mutex
	keysIn map[keyspace.Range]bool
}

func (t *Timeline) newHandle(d layer.Desc) *handle {
	return &handle{t: t, desc: d, uploaded: d.Uploaded}
}

// Desc implements layermap.Item.
func (h *handle) Desc() *layer.Desc { return &h.desc }

func (h *handle) path() string { return filepath.Join(h.t.dir, h.desc.Name) }

// acquire returns the open reader with h.mu read-locked; call release after.
func (h *handle) acquire(ctx context.Context) (*layer.Reader, error) {
	h.lastUse.Store(h.t.d.Now().UnixNano())
	h.mu.RLock()
	if h.r != nil {
		return h.r, nil
	}
	if h.gone {
		h.mu.RUnlock()
		return nil, errLayerGone
	}
	h.mu.RUnlock()
	h.mu.Lock()
	if h.r == nil && !h.gone {
		if err := h.openLocked(ctx); err != nil {
			h.mu.Unlock()
			return nil, err
		}
	}
	h.mu.Unlock()
	return h.acquire(ctx)
}

func (h *handle) release() { h.mu.RUnlock() }

func (h *handle) openLocked(ctx context.Context) error {
	f, err := os.Open(h.path())
	if errors.Is(err, os.ErrNotExist) && h.t.d.Remote != nil && h.uploaded {
		if err := h.t.d.Remote.Download(ctx, h.t.id, h.desc, h.path()); err != nil {
			return err
		}
		h.t.d.Metrics.downloaded(h.desc.Size)
		f, err = os.Open(h.path())
	}
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	// Layer files are immutable: map them, so that a read is a copy, not
	// a system call (a pread of 8 KiB cost tens of microseconds here).
	var src layer.Source = fileSource{f, st.Size()}
	var mm []byte
	if st.Size() > 0 && st.Size() < 1<<40 {
		if b, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED); err == nil {
			mm, src = b, mmapSource(b)
		}
	}
	r, err := layer.Open(src)
	if err != nil {
		if mm != nil {
			_ = syscall.Munmap(mm)
		}
		f.Close()
		return err
	}
	h.r, h.f, h.mm = r, f, mm
	return nil
}

type fileSource struct {
	*os.File
	size int64
}

func (f fileSource) Size() int64 { return f.size }

// mmapSource reads a mapped layer file. Reads copy out of the mapping, so
// no slice of it outlives the handle's read lock (it is unmapped when the
// layer is closed, evicted or deleted).
type mmapSource []byte

func (m mmapSource) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off >= int64(len(m)) {
		if len(p) == 0 {
			return 0, nil
		}
		return 0, io.EOF
	}
	n := copy(p, m[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (m mmapSource) Size() int64 { return int64(len(m)) }

// versions returns the entries of key k at or below upto in this layer.
func (h *handle) versions(ctx context.Context, v []cand, k keyAt) ([]cand, error) {
	r, err := h.acquire(ctx)
	if err != nil {
		return v, err
	}
	defer h.release()
	es := r.ReadVersions(k.key, k.upto)
	for _, e := range es {
		v = append(v, cand{v: layer.Version{Key: e.Key, LSN: e.LSN, Seq: e.Seq, Kind: e.Kind}, h: h, e: e})
	}
	if len(es) == 0 && h.desc.Kind == layer.ImageLayer {
		// An image layer is authoritative for its key range at its LSN:
		// a key it does not hold did not exist.
		v = append(v, cand{v: layer.Version{Key: k.key, LSN: h.desc.LSNStart, Kind: layer.Tombstone}, absent: true})
	}
	return v, nil
}

func (h *handle) read(ctx context.Context, e layer.Entry) ([]byte, error) {
	r, err := h.acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer h.release()
	return r.Read(e)
}

// isLocal reports whether the file is on local disk.
func (h *handle) isLocal() bool {
	_, err := os.Stat(h.path())
	return err == nil
}

// evict closes the reader and deletes the local copy. REQUIRES: uploaded.
func (h *handle) evict() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.uploaded || h.gone {
		return false
	}
	h.closeLocked()
	return os.Remove(h.path()) == nil
}

// remove closes and deletes the local copy for good (the layer left the map).
func (h *handle) remove() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gone = true
	h.closeLocked()
	_ = os.Remove(h.path())
}

func (h *handle) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closeLocked()
}

func (h *handle) closeLocked() {
	if h.mm != nil {
		_ = syscall.Munmap(h.mm)
	}
	if h.f != nil {
		h.f.Close()
	}
	h.r, h.f, h.mm = nil, nil, nil
}

// keyAt is a read request inside one timeline.
type keyAt struct {
	key  keyspace.Key
	upto pg.LSN
}
