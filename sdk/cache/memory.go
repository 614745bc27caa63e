package cache

import (
	"fmt"
	"sync"

	"github.com/stratadb/strata/sdk/pg"
)

// Memory is the reference implementation of Cache: one map and one FIFO
// queue behind one mutex, one page per allocation unit. It is simple enough
// to be obviously right and is what cachetest and other implementations are
// compared against; it is not meant to be fast.
type Memory struct {
	mu     sync.Mutex
	pages  map[pg.PageKey]*memPage
	fifo   []pg.PageKey // insertion order; may hold keys already dropped
	cap    int64        // in pages
	closed bool
	st     Stats
}

type memPage struct {
	data []byte
	lsn  pg.LSN
}

var _ Cache = (*Memory)(nil)

// NewMemory returns an empty Memory cache of capacity bytes (rounded down to
// whole pages).
func NewMemory(bytes int64) (*Memory, error) {
	if bytes < 0 {
		return nil, fmt.Errorf("%w: %d", ErrBadSize, bytes)
	}
	return &Memory{pages: map[pg.PageKey]*memPage{}, cap: bytes / pg.BlockSize}, nil
}

// Get implements Cache.
func (m *Memory) Get(key pg.PageKey, dst []byte) (bool, error) {
	if len(dst) < pg.BlockSize {
		return false, ErrShortBuffer
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false, ErrClosed
	}
	p, ok := m.pages[key]
	if !ok {
		m.st.Misses++
		return false, nil
	}
	copy(dst[:pg.BlockSize], p.data)
	m.st.Hits++
	return true, nil
}

// Put implements Cache.
func (m *Memory) Put(key pg.PageKey, page []byte, lsn pg.LSN) error {
	if len(page) != pg.BlockSize {
		return ErrPageSize
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if p, ok := m.pages[key]; ok {
		if lsn != pg.InvalidLSN && lsn < p.lsn {
			m.st.StalePuts++
			return nil
		}
		copy(p.data, page)
		p.lsn = lsn
		m.st.Puts++
		return nil
	}
	if m.cap == 0 {
		return nil
	}
	m.shrinkTo(m.cap - 1)
	m.pages[key] = &memPage{data: append([]byte(nil), page...), lsn: lsn}
	m.fifo = append(m.fifo, key)
	m.st.Puts++
	return nil
}

// shrinkTo evicts in FIFO order until at most n pages remain.
func (m *Memory) shrinkTo(n int64) {
	for int64(len(m.pages)) > n {
		k := m.fifo[0]
		m.fifo = m.fifo[1:]
		if _, ok := m.pages[k]; ok {
			delete(m.pages, k)
			m.st.Evictions++
		}
	}
	if len(m.fifo) > 2*len(m.pages)+64 { // compact dropped keys
		live := m.fifo[:0:0]
		for _, k := range m.fifo {
			if _, ok := m.pages[k]; ok {
				live = append(live, k)
			}
		}
		m.fifo = live
	}
}

// Invalidate implements Cache.
func (m *Memory) Invalidate(key pg.PageKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, ok := m.pages[key]; ok {
		delete(m.pages, key)
		m.st.Invalidations++
	}
	return nil
}

// InvalidateRel implements Cache.
func (m *Memory) InvalidateRel(tag pg.RelTag, from uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	for k := range m.pages {
		if k.Tag() == tag && k.Block >= from {
			delete(m.pages, k)
			m.st.Invalidations++
		}
	}
	return nil
}

// Resize implements Cache.
func (m *Memory) Resize(bytes int64) error {
	if bytes < 0 {
		return fmt.Errorf("%w: %d", ErrBadSize, bytes)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.cap = bytes / pg.BlockSize
	m.shrinkTo(m.cap)
	return nil
}

// Stats implements Cache.
func (m *Memory) Stats() Stats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.st
	s.Pages = int64(len(m.pages))
	s.UsedBytes = s.Pages * pg.BlockSize
	s.CapacityBytes = m.cap * pg.BlockSize
	return s
}

// Close implements Cache.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.pages = nil
	m.fifo = nil
	return nil
}
