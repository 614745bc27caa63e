package fusefs

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/stratadb/strata/sdk/pg"
)

// Memory is the in-memory reference Backend: every mutation is durable at
// once, and Sync returns immediately. It also records the highest w it was
// given (MaxW) so that tests can check the tagging.
type Memory struct {
	mu    sync.RWMutex
	rels  map[pg.RelTag]*memRel
	files map[string]*memFile
	maxW  pg.LSN
	flat  bool // no parent-folder checks (the compute's local store)
}

type memRel struct {
	nblocks uint32
	pages   map[uint32][]byte
}

type memFile struct {
	dir  bool
	mode uint32
	data []byte
}

var _ Backend = (*Memory)(nil)

// NewMemory returns an empty Memory backend.
func NewMemory() *Memory {
	return &Memory{rels: map[pg.RelTag]*memRel{}, files: map[string]*memFile{}}
}

// MaxW returns the highest WAL position any mutation was tagged with.
func (m *Memory) MaxW() pg.LSN {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.maxW
}

func (m *Memory) tag(w pg.LSN) {
	if w > m.maxW {
		m.maxW = w
	}
}

func (m *Memory) ListRels(context.Context) ([]RelInfo, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]RelInfo, 0, len(m.rels))
	for t, r := range m.rels {
		out = append(out, RelInfo{Rel: t, Nblocks: r.nblocks})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rel.String() < out[j].Rel.String() })
	return out, nil
}

func (m *Memory) CreateRel(_ context.Context, rel pg.RelTag, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tag(w)
	m.rels[rel] = &memRel{pages: map[uint32][]byte{}}
	return nil
}

func (m *Memory) Nblocks(_ context.Context, rel pg.RelTag) (uint32, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.rels[rel]
	if !ok {
		return 0, fmt.Errorf("%w: relation %s", ErrNotFound, rel)
	}
	return r.nblocks, nil
}

func (m *Memory) ReadPage(_ context.Context, key pg.PageKey, _ pg.LSN, page []byte) error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.rels[key.Tag()]
	if !ok || key.Block >= r.nblocks {
		return fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if p, ok := r.pages[key.Block]; ok {
		copy(page, p)
	} else {
		clear(page[:pg.BlockSize])
	}
	return nil
}

func (m *Memory) WritePage(_ context.Context, key pg.PageKey, page []byte, w pg.LSN) error {
	if len(page) != pg.BlockSize {
		return fmt.Errorf("fusefs: page of %d bytes", len(page))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rels[key.Tag()]
	if !ok {
		return fmt.Errorf("%w: relation %s", ErrNotFound, key.Tag())
	}
	m.tag(w)
	if p, ok := r.pages[key.Block]; ok {
		copy(p, page) // overwrite in place: readers copy under the lock
	} else {
		r.pages[key.Block] = append([]byte(nil), page...)
	}
	if key.Block >= r.nblocks {
		r.nblocks = key.Block + 1
	}
	return nil
}

func (m *Memory) TruncateRel(_ context.Context, rel pg.RelTag, nblocks uint32, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.rels[rel]
	if !ok {
		return fmt.Errorf("%w: relation %s", ErrNotFound, rel)
	}
	m.tag(w)
	for b := range r.pages {
		if b >= nblocks {
			delete(r.pages, b)
		}
	}
	r.nblocks = nblocks
	return nil
}

func (m *Memory) UnlinkRel(_ context.Context, rel pg.RelTag, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.rels[rel]; !ok {
		return fmt.Errorf("%w: relation %s", ErrNotFound, rel)
	}
	m.tag(w)
	delete(m.rels, rel)
	return nil
}

func (m *Memory) List(context.Context) ([]FileInfo, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]FileInfo, 0, len(m.files))
	for p, f := range m.files {
		out = append(out, FileInfo{Path: p, Dir: f.dir, Mode: f.mode, Size: int64(len(f.data))})
	}
	// Parents sort before children: compare by depth, then name.
	sort.Slice(out, func(i, j int) bool {
		di, dj := strings.Count(out[i].Path, "/"), strings.Count(out[j].Path, "/")
		if di != dj {
			return di < dj
		}
		return out[i].Path < out[j].Path
	})
	return out, nil
}

func (m *Memory) parentOK(p string) error {
	dir := path.Dir(p)
	if dir == "." || m.flat {
		return nil
	}
	if f, ok := m.files[dir]; !ok || !f.dir {
		return fmt.Errorf("%w: folder %s", ErrNotFound, dir)
	}
	return nil
}

func (m *Memory) Mkdir(_ context.Context, p string, mode uint32, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[p]; ok {
		return fmt.Errorf("%w: %s", ErrExists, p)
	}
	if err := m.parentOK(p); err != nil {
		return err
	}
	m.tag(w)
	m.files[p] = &memFile{dir: true, mode: mode}
	return nil
}

func (m *Memory) CreateFile(_ context.Context, p string, mode uint32, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[p]; ok {
		return fmt.Errorf("%w: %s", ErrExists, p)
	}
	if err := m.parentOK(p); err != nil {
		return err
	}
	m.tag(w)
	m.files[p] = &memFile{mode: mode}
	return nil
}

func (m *Memory) file(p string) (*memFile, error) {
	f, ok := m.files[p]
	if !ok || f.dir {
		return nil, fmt.Errorf("%w: file %s", ErrNotFound, p)
	}
	return f, nil
}

func (m *Memory) ReadFile(_ context.Context, p string, off int64, buf []byte) (int, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	f, err := m.file(p)
	if err != nil {
		return 0, err
	}
	if off >= int64(len(f.data)) {
		return 0, nil
	}
	return copy(buf, f.data[off:]), nil
}

func (m *Memory) WriteFile(_ context.Context, p string, off int64, data []byte, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, err := m.file(p)
	if err != nil {
		return err
	}
	m.tag(w)
	if end := off + int64(len(data)); end > int64(len(f.data)) {
		if end <= int64(cap(f.data)) {
			f.data = f.data[:end]
		} else {
			n := make([]byte, end, end+end/4)
			copy(n, f.data)
			f.data = n
		}
	}
	copy(f.data[off:], data)
	return nil
}

func (m *Memory) TruncateFile(_ context.Context, p string, size int64, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, err := m.file(p)
	if err != nil {
		return err
	}
	m.tag(w)
	if size <= int64(len(f.data)) {
		clear(f.data[size:])
		f.data = f.data[:size]
	} else {
		n := make([]byte, size)
		copy(n, f.data)
		f.data = n
	}
	return nil
}

func (m *Memory) Rename(_ context.Context, from, to string, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, err := m.file(from)
	if err != nil {
		return err
	}
	if t, ok := m.files[to]; ok && t.dir {
		return fmt.Errorf("%w: %s is a folder", ErrExists, to)
	}
	if err := m.parentOK(to); err != nil {
		return err
	}
	m.tag(w)
	delete(m.files, from)
	m.files[to] = f
	return nil
}

func (m *Memory) Remove(_ context.Context, p string, w pg.LSN) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.files[p]
	if !ok {
		return fmt.Errorf("%w: %s", ErrNotFound, p)
	}
	if f.dir {
		prefix := p + "/"
		for q := range m.files {
			if strings.HasPrefix(q, prefix) {
				return fmt.Errorf("%w: %s", ErrNotEmpty, p)
			}
		}
	}
	m.tag(w)
	delete(m.files, p)
	return nil
}

func (m *Memory) Sync(context.Context, pg.LSN) error { return nil }
