// Package faulty wraps an objectstore.Store and injects failures into it:
// transient and permanent errors, latency, and streams that break after a
// number of bytes. Tests use it to prove that the retry wrapper and the
// callers of a Store survive a flaky backend, and that no failure leaves a
// half-written object visible.
//
// Rules are drawn from a generator seeded by Config.Seed, so a sequence of
// calls made one at a time sees the same faults in every run.
//
// It is for tests only: it is not a chaos tool for production stores.
package faulty

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/stratadb/strata/sdk/objectstore"
)

// ErrInjected is the error a rule injects when its Err is nil.
var ErrInjected = errors.New("faulty: injected failure")

// Op is a set of Store operations.
type Op uint8

// Operations. OpAll (or 0 in a Rule) matches every one.
const (
	OpPut Op = 1 << iota
	OpGet
	OpGetRange
	OpStat
	OpList
	OpDelete
	OpAll Op = 1<<iota - 1
)

func (o Op) String() string {
	names := []string{"put", "get", "get_range", "stat", "list", "delete"}
	s := ""
	for i, n := range names {
		if o&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += n
		}
	}
	return s
}

// Fault is what a rule does when it fires.
type Fault int

const (
	// FailCall fails the call before it reaches the wrapped store.
	FailCall Fault = iota
	// FailStream lets the call through but breaks its stream after
	// Rule.After units: for Put, the reader the wrapped store consumes fails
	// after After bytes (so the wrapped store sees a failing upload); for
	// Get and GetRange, the returned reader fails after After bytes; for
	// List, the listing fails after After objects. Objects shorter than
	// After are not affected.
	FailStream
	// Delay sleeps Rule.Latency (or until the context is done) before the
	// call, which then proceeds (other rules may still fail it).
	Delay
	// FailReply lets a Put or Delete through to the wrapped store, and
	// fails it once that store has done it: the reply lost to a cut
	// connection. Retried, a conditional create then finds its own
	// object (objectstore.ErrExists). On other operations it is FailCall.
	FailReply
)

// Rule is one kind of fault on a set of operations.
type Rule struct {
	Ops   Op // 0 means OpAll
	Fault Fault
	// Err is the injected error (ErrInjected when nil). With Transient it
	// is wrapped with objectstore.Transient.
	Err       error
	Transient bool
	After     int64         // FailStream: bytes (objects for List) before the failure
	Latency   time.Duration // Delay
	// Probability is the chance that the rule fires on a matching call;
	// 0 means always.
	Probability float64
	// Times is how many times the rule may fire before it expires ("the
	// next N calls"); 0 means without limit.
	Times int
}

// Config configures a faulty Store.
type Config struct {
	Seed  uint64
	Rules []Rule
}

// Store is the fault-injecting wrapper. Its methods are safe for
// concurrent use; rules may be changed while calls run.
type Store struct {
	s objectstore.Store

	mu    sync.Mutex
	rng   *rand.Rand
	rules []*ruleState
	fired int
}

type ruleState struct {
	Rule
	fired int
}

var _ objectstore.Store = (*Store)(nil)

// New wraps s. Closing the returned store closes s.
func New(s objectstore.Store, cfg Config) *Store {
	f := &Store{s: s, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5eed))}
	for _, r := range cfg.Rules {
		f.Add(r)
	}
	return f
}

// Add appends a rule.
func (f *Store) Add(r Rule) {
	if r.Ops == 0 {
		r.Ops = OpAll
	}
	f.mu.Lock()
	f.rules = append(f.rules, &ruleState{Rule: r})
	f.mu.Unlock()
}

// Reset removes every rule.
func (f *Store) Reset() {
	f.mu.Lock()
	f.rules = nil
	f.mu.Unlock()
}

// Fired returns how many faults have been injected so far.
func (f *Store) Fired() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.fired
}

// plan is the faults drawn for one call.
type plan struct {
	delay  time.Duration
	fail   error // FailCall
	stream error // FailStream
	after  int64
	reply  error // FailReply
}

func (r *Rule) err(op Op) error {
	err := r.Err
	if err == nil {
		err = ErrInjected
	}
	err = fmt.Errorf("faulty: %s: %w", op, err)
	if r.Transient {
		err = objectstore.Transient(err)
	}
	return err
}

func (f *Store) draw(op Op) plan {
	f.mu.Lock()
	defer f.mu.Unlock()
	var p plan
	for _, r := range f.rules {
		if r.Ops&op == 0 || (r.Times > 0 && r.fired >= r.Times) {
			continue
		}
		if (r.Fault == FailCall || r.Fault == FailReply) && (p.fail != nil || p.reply != nil) || r.Fault == FailStream && (p.fail != nil || p.stream != nil) {
			continue // an earlier rule already decided
		}
		if r.Probability > 0 && f.rng.Float64() >= r.Probability {
			continue
		}
		r.fired++
		f.fired++
		switch r.Fault {
		case FailCall:
			p.fail = r.err(op)
		case FailStream:
			p.stream, p.after = r.err(op), r.After
		case Delay:
			p.delay += r.Latency
		case FailReply:
			if op == OpPut || op == OpDelete {
				p.reply = r.err(op)
			} else {
				p.fail = r.err(op)
			}
		}
	}
	return p
}

// before applies the delay and the call failure of the plan.
func (p plan) before(ctx context.Context) error {
	if p.delay > 0 {
		t := time.NewTimer(p.delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
	return p.fail
}

// Put implements objectstore.Store.
func (f *Store) Put(ctx context.Context, key string, r io.Reader, opts objectstore.PutOptions) error {
	p := f.draw(OpPut)
	if err := p.before(ctx); err != nil {
		return err
	}
	if p.stream != nil {
		r = &breakingReader{r: r, left: p.after, err: p.stream}
	}
	if err := f.s.Put(ctx, key, r, opts); err != nil {
		return err
	}
	return p.reply
}

// Get implements objectstore.Store.
func (f *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return f.get(ctx, OpGet, func() (io.ReadCloser, error) { return f.s.Get(ctx, key) })
}

// GetRange implements objectstore.Store.
func (f *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	return f.get(ctx, OpGetRange, func() (io.ReadCloser, error) { return f.s.GetRange(ctx, key, off, length) })
}

func (f *Store) get(ctx context.Context, op Op, call func() (io.ReadCloser, error)) (io.ReadCloser, error) {
	p := f.draw(op)
	if err := p.before(ctx); err != nil {
		return nil, err
	}
	rc, err := call()
	if err != nil || p.stream == nil {
		return rc, err
	}
	return &breakingReadCloser{breakingReader{r: rc, left: p.after, err: p.stream}, rc}, nil
}

// Stat implements objectstore.Store.
func (f *Store) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	if err := f.draw(OpStat).before(ctx); err != nil {
		return objectstore.ObjectInfo{}, err
	}
	return f.s.Stat(ctx, key)
}

// List implements objectstore.Store.
func (f *Store) List(ctx context.Context, prefix string, fn func(objectstore.ObjectInfo) error) error {
	p := f.draw(OpList)
	if err := p.before(ctx); err != nil {
		return err
	}
	if p.stream == nil {
		return f.s.List(ctx, prefix, fn)
	}
	n := int64(0)
	var injected bool
	err := f.s.List(ctx, prefix, func(info objectstore.ObjectInfo) error {
		if n >= p.after {
			injected = true
			return p.stream
		}
		n++
		return fn(info)
	})
	if injected {
		return p.stream
	}
	return err
}

// Delete implements objectstore.Store.
func (f *Store) Delete(ctx context.Context, key string) error {
	p := f.draw(OpDelete)
	if err := p.before(ctx); err != nil {
		return err
	}
	if err := f.s.Delete(ctx, key); err != nil {
		return err
	}
	return p.reply
}

// Close implements objectstore.Store; it injects nothing.
func (f *Store) Close() error { return f.s.Close() }

// breakingReader yields left bytes of r, then fails with err.
type breakingReader struct {
	r    io.Reader
	left int64
	err  error
}

func (b *breakingReader) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, b.err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.r.Read(p)
	b.left -= int64(n)
	return n, err
}

type breakingReadCloser struct {
	breakingReader
	c io.Closer
}

func (b *breakingReadCloser) Close() error { return b.c.Close() }
