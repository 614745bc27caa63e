package objectstore

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"time"
)

// Memory is the in-memory reference Store. It honours the whole contract and
// is what other implementations are measured against: tests use it as a
// fake, and the wrappers in this package are tested over it.
//
// Put reads the object fully before it becomes visible (so it holds the whole
// object in memory, unlike a real backend); stored bytes are never modified,
// so readers returned by Get keep working after the key is replaced, deleted
// or the store closed.
type Memory struct {
	now func() time.Time

	mu     sync.RWMutex
	objs   map[string]memObject
	closed bool
}

type memObject struct {
	data []byte
	mod  time.Time
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{now: time.Now, objs: make(map[string]memObject)}
}

func (m *Memory) check(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return ValidateKey(key)
}

// Put implements Store.
func (m *Memory) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) error {
	if err := m.check(ctx, key); err != nil {
		return err
	}
	if err := m.isClosed(); err != nil {
		return err
	}
	var buf bytes.Buffer
	if opts.Size >= 0 {
		// Room for the body and for ReadFrom's final read that sees EOF.
		buf.Grow(int(opts.Size) + bytes.MinRead)
	}
	n, err := io.Copy(&buf, ContextReader(ctx, r))
	if err != nil {
		return fmt.Errorf("objectstore: memory put %q: reading body: %w", key, err)
	}
	if opts.Size >= 0 && n != opts.Size {
		return fmt.Errorf("objectstore: memory put %q: body has %d bytes, PutOptions.Size said %d", key, n, opts.Size)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	if _, ok := m.objs[key]; ok && opts.IfNotExists {
		return fmt.Errorf("memory put %q: %w", key, ErrExists)
	}
	m.objs[key] = memObject{data: buf.Bytes(), mod: m.now()}
	return nil
}

func (m *Memory) isClosed() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return ErrClosed
	}
	return nil
}

func (m *Memory) lookup(ctx context.Context, key string) (memObject, error) {
	if err := m.check(ctx, key); err != nil {
		return memObject{}, err
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.closed {
		return memObject{}, ErrClosed
	}
	o, ok := m.objs[key]
	if !ok {
		return memObject{}, fmt.Errorf("memory %q: %w", key, ErrNotFound)
	}
	return o, nil
}

// Get implements Store.
func (m *Memory) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return m.GetRange(ctx, key, 0, -1)
}

// GetRange implements Store. A negative off is ErrInvalidRange.
func (m *Memory) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	o, err := m.lookup(ctx, key)
	if err != nil {
		return nil, err
	}
	size := int64(len(o.data))
	if off < 0 || off > size {
		return nil, fmt.Errorf("memory %q: offset %d, size %d: %w", key, off, size, ErrInvalidRange)
	}
	end := size
	if length >= 0 && length < size-off {
		end = off + length
	}
	return ContextReadCloser(ctx, io.NopCloser(bytes.NewReader(o.data[off:end]))), nil
}

// Stat implements Store.
func (m *Memory) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	o, err := m.lookup(ctx, key)
	if err != nil {
		return ObjectInfo{}, err
	}
	return ObjectInfo{Key: key, Size: int64(len(o.data)), ModTime: o.mod}, nil
}

// List implements Store. It lists a snapshot taken when it starts; fn may
// call the store.
func (m *Memory) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.RLock()
	if m.closed {
		m.mu.RUnlock()
		return ErrClosed
	}
	infos := make([]ObjectInfo, 0, len(m.objs))
	for k, o := range m.objs {
		if strings.HasPrefix(k, prefix) {
			infos = append(infos, ObjectInfo{Key: k, Size: int64(len(o.data)), ModTime: o.mod})
		}
	}
	m.mu.RUnlock()
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key < infos[j].Key })
	for _, info := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(info); err != nil {
			return err
		}
	}
	return nil
}

// Delete implements Store.
func (m *Memory) Delete(ctx context.Context, key string) error {
	if err := m.check(ctx, key); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	delete(m.objs, key)
	return nil
}

// Close implements Store. It drops every object; a second Close returns
// ErrClosed.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	m.closed = true
	m.objs = nil
	return nil
}
