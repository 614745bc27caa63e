package replication

import (
	"context"
	"fmt"
	"sync"

	"github.com/stratadb/strata/sdk/pg"
)

// Memory is the in-memory reference Source: WAL appended with Append becomes
// committed at once. It keeps consumers' progress for tests (Progress).
type Memory struct {
	mu       sync.Mutex
	sysID    uint64
	start    pg.LSN
	data     []byte
	progress map[string]Progress
	changed  chan struct{}
	closed   bool
}

var _ Source = (*Memory)(nil)

// NewMemory returns a source whose WAL begins at start.
func NewMemory(systemID uint64, start pg.LSN) *Memory {
	return &Memory{sysID: systemID, start: start, progress: map[string]Progress{}, changed: make(chan struct{})}
}

// Append adds committed WAL at the end.
func (m *Memory) Append(b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.data = append(m.data, b...)
	close(m.changed)
	m.changed = make(chan struct{})
}

// Progress returns what consumer last reported.
func (m *Memory) Progress(consumer string) Progress {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.progress[consumer]
}

// Positions implements Source.
func (m *Memory) Positions(ctx context.Context) (Positions, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return Positions{}, ErrClosed
	}
	return Positions{SystemID: m.sysID, Start: m.start, Commit: m.start + pg.LSN(len(m.data))}, nil
}

// Stream implements Source.
func (m *Memory) Stream(ctx context.Context, consumer string, start pg.LSN) (Stream, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	if start < m.start || start > m.start+pg.LSN(len(m.data)) {
		return nil, fmt.Errorf("%w: %s is outside %s..%s", ErrNotHeld, start, m.start, m.start+pg.LSN(len(m.data)))
	}
	ctx, cancel := context.WithCancel(ctx)
	return &memStream{m: m, consumer: consumer, pos: start, ctx: ctx, cancel: cancel}, nil
}

// Close implements Source.
func (m *Memory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.changed)
	}
	return nil
}

type memStream struct {
	m        *Memory
	consumer string
	pos      pg.LSN
	ctx      context.Context
	cancel   context.CancelFunc
}

func (s *memStream) Recv() (Chunk, error) {
	for {
		s.m.mu.Lock()
		if s.m.closed {
			s.m.mu.Unlock()
			return Chunk{}, ErrClosed
		}
		end := s.m.start + pg.LSN(len(s.m.data))
		if s.pos < end {
			n := min(int(end-s.pos), 128<<10)
			off := int(s.pos - s.m.start)
			c := Chunk{Start: s.pos, Data: append([]byte(nil), s.m.data[off:off+n]...), Commit: end}
			s.pos += pg.LSN(n)
			s.m.mu.Unlock()
			return c, nil
		}
		ch := s.m.changed
		s.m.mu.Unlock()
		select {
		case <-ch:
		case <-s.ctx.Done():
			return Chunk{}, fmt.Errorf("%w: %w", ErrClosed, s.ctx.Err())
		}
	}
}

func (s *memStream) Feedback(p Progress) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	old := s.m.progress[s.consumer]
	s.m.progress[s.consumer] = Progress{Received: max(old.Received, p.Received), Durable: max(old.Durable, p.Durable), Uploaded: max(old.Uploaded, p.Uploaded)}
	return nil
}

func (s *memStream) Close() error {
	s.cancel()
	return nil
}
