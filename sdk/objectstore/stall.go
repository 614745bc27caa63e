package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// ErrStalled is matched (with ErrTransient) by the error of a call that
// WithStallTimeout ended because the store made no progress.
var ErrStalled = errors.New("the object store stopped answering")

// WithStallTimeout returns a Store whose calls to s fail with a transient
// error matching ErrStalled when the store makes no progress for d, so
// that WithRetry (wrapped around it) repeats them and a caller's loop goes
// on. A store that stops answering without closing its connections (a
// network path that drops packets, a frozen server) would otherwise hold
// a call until the kernel gives up on the connection, many minutes later,
// and with it whatever waits for the call: the pageserver's background
// work waited behind one hung upload.
//
// Progress is the store reading a Put's body, a Get's body arriving at
// the caller's Read, an object listed; waiting for an answer counts from
// the call (or the last body read) on. The time the caller's own reader
// takes to fill a Put's body, the caller between two Reads of a Get, and
// a List callback do not count. Each Put of a body must therefore be
// answered within d of its last read: d bounds how slowly a store may
// take a multipart part, too. d <= 0 returns s.
//
// It implements no FilePutter: a file is put by reading it (PutFile's
// fallback), which is what every store but fs does anyway.
func WithStallTimeout(s Store, d time.Duration) Store {
	if d <= 0 {
		return s
	}
	return &stallStore{s: s, d: d}
}

type stallStore struct {
	s Store
	d time.Duration
}

var _ Store = (*stallStore)(nil)

// watchdog cancels its context with errStalledCause once it has been
// armed for d without a kick.
type watchdog struct {
	parent context.Context
	ctx    context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer
	d      time.Duration
}

type stallCause struct{}

func (stallCause) Error() string { return "objectstore: stalled" }

func (ss *stallStore) watch(ctx context.Context) *watchdog {
	w := &watchdog{parent: ctx, d: ss.d}
	w.ctx, w.cancel = context.WithCancelCause(ctx)
	w.timer = time.AfterFunc(ss.d, func() { w.cancel(stallCause{}) })
	return w
}

func (w *watchdog) arm()  { w.timer.Reset(w.d) }
func (w *watchdog) rest() { w.timer.Stop() }
func (w *watchdog) done() { w.timer.Stop(); w.cancel(nil) }

// result turns the error of a call the watchdog ended into a transient
// ErrStalled; other errors are returned as they are.
func (w *watchdog) result(op, key string, err error) error {
	if err == nil || w.parent.Err() != nil || !errors.As(context.Cause(w.ctx), new(stallCause)) {
		return err
	}
	return Transient(fmt.Errorf("objectstore: %s %q: %w (no answer or progress for %s): %w", op, key, ErrStalled, w.d, err))
}

func (ss *stallStore) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) error {
	w := ss.watch(ctx)
	defer w.done()
	return w.result("put", key, ss.s.Put(w.ctx, key, &stallBody{r: r, w: w}, opts))
}

// stallBody is a Put's body: the store reading it is progress, the
// caller's reader filling it is not the store's time.
type stallBody struct {
	r io.Reader
	w *watchdog
}

func (b *stallBody) Read(p []byte) (int, error) {
	b.w.rest()
	n, err := b.r.Read(p)
	b.w.arm()
	return n, err
}

func (ss *stallStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return ss.get(ctx, key, func(ctx context.Context) (io.ReadCloser, error) { return ss.s.Get(ctx, key) })
}

func (ss *stallStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	return ss.get(ctx, key, func(ctx context.Context) (io.ReadCloser, error) { return ss.s.GetRange(ctx, key, off, length) })
}

func (ss *stallStore) get(ctx context.Context, key string, open func(context.Context) (io.ReadCloser, error)) (io.ReadCloser, error) {
	w := ss.watch(ctx)
	rc, err := open(w.ctx)
	if err != nil {
		w.done()
		return nil, w.result("get", key, err)
	}
	w.rest() // the body belongs to the caller's pace now
	return &stallReader{rc: rc, w: w, key: key}, nil
}

// stallReader watches each Read of a Get's body; its context lives until
// Close.
type stallReader struct {
	rc  io.ReadCloser
	w   *watchdog
	key string
}

func (r *stallReader) Read(p []byte) (int, error) {
	r.w.arm()
	n, err := r.rc.Read(p)
	r.w.rest()
	if err != nil && err != io.EOF {
		err = r.w.result("get", r.key, err)
	}
	return n, err
}

func (r *stallReader) Close() error {
	err := r.rc.Close()
	r.w.done()
	return err
}

func (ss *stallStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	w := ss.watch(ctx)
	defer w.done()
	info, err := ss.s.Stat(w.ctx, key)
	return info, w.result("stat", key, err)
}

func (ss *stallStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	w := ss.watch(ctx)
	defer w.done()
	return w.result("list", prefix, ss.s.List(w.ctx, prefix, func(info ObjectInfo) error {
		w.rest()
		defer w.arm()
		return fn(info)
	}))
}

func (ss *stallStore) Delete(ctx context.Context, key string) error {
	w := ss.watch(ctx)
	defer w.done()
	return w.result("delete", key, ss.s.Delete(w.ctx, key))
}

func (ss *stallStore) Close() error { return ss.s.Close() }
