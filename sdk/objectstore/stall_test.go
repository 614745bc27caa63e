package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// hangStore is a memory store whose calls hang until their context ends
// while hang is set (a store that stopped answering), and whose Put reads
// the body in small steps with a pause between them (a slow but working
// store).
type hangStore struct {
	*objectstore.Memory
	hang     atomic.Int32 // calls left to hang
	readStep time.Duration
}

func (h *hangStore) hung(ctx context.Context) error {
	if h.hang.Add(-1) < 0 {
		h.hang.Add(1)
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (h *hangStore) Put(ctx context.Context, key string, r io.Reader, opts objectstore.PutOptions) error {
	if err := h.hung(ctx); err != nil {
		return err
	}
	var buf bytes.Buffer
	p := make([]byte, 4)
	for {
		if h.readStep > 0 {
			time.Sleep(h.readStep)
		}
		n, err := r.Read(p)
		buf.Write(p[:n])
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	return h.Memory.Put(ctx, key, &buf, opts)
}

func (h *hangStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := h.hung(ctx); err != nil {
		return nil, err
	}
	rc, err := h.Memory.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return &hangBody{rc: rc, h: h, ctx: ctx}, nil
}

// hangBody hangs a Read while the store hangs.
type hangBody struct {
	rc  io.ReadCloser
	h   *hangStore
	ctx context.Context
}

func (b *hangBody) Read(p []byte) (int, error) {
	if err := b.h.hung(b.ctx); err != nil {
		return 0, err
	}
	return b.rc.Read(p)
}

func (b *hangBody) Close() error { return b.rc.Close() }

func (h *hangStore) List(ctx context.Context, prefix string, fn func(objectstore.ObjectInfo) error) error {
	if err := h.hung(ctx); err != nil {
		return err
	}
	return h.Memory.List(ctx, prefix, fn)
}

func (h *hangStore) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	if err := h.hung(ctx); err != nil {
		return objectstore.ObjectInfo{}, err
	}
	return h.Memory.Stat(ctx, key)
}

func (h *hangStore) Delete(ctx context.Context, key string) error {
	if err := h.hung(ctx); err != nil {
		return err
	}
	return h.Memory.Delete(ctx, key)
}

// slowReader is a caller's body that takes its time to fill each read.
type slowReader struct {
	r    io.Reader
	step time.Duration
}

func (s *slowReader) Read(p []byte) (int, error) {
	time.Sleep(s.step)
	return s.r.Read(p[:min(len(p), 4)])
}

// TestStallTimeout: a call to a store that stops answering fails after
// the stall time with a transient ErrStalled (and WithRetry's next attempt
// succeeds); a store that is slow but makes progress, a caller's slow
// body, a caller that pauses between reads and a slow List callback are
// not stalls; a cancelled caller gets its own error.
func TestStallTimeout(t *testing.T) {
	const d = 60 * time.Millisecond
	ctx := context.Background()
	h := &hangStore{Memory: objectstore.NewMemory()}
	st := objectstore.WithStallTimeout(h, d)
	stalled := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, objectstore.ErrStalled) || !objectstore.IsTransient(err) {
			t.Fatalf("%s on a store that stopped answering: %v, want a transient ErrStalled", what, err)
		}
	}

	h.hang.Store(1)
	start := time.Now()
	stalled("put", st.Put(ctx, "k", strings.NewReader("hello"), objectstore.PutOptions{Size: 5}))
	if el := time.Since(start); el > 20*d {
		t.Fatalf("the stalled put took %s", el)
	}
	h.hang.Store(1)
	_, err := st.Get(ctx, "k")
	stalled("get", err)
	h.hang.Store(1)
	stalled("list", st.List(ctx, "", func(objectstore.ObjectInfo) error { return nil }))
	h.hang.Store(1)
	_, err = st.Stat(ctx, "k")
	stalled("stat", err)
	h.hang.Store(1)
	stalled("delete", st.Delete(ctx, "k"))

	// Slow progress: 20 reads of 4 bytes, 4/5 of d apart (1.2 s in all).
	h.readStep = d * 4 / 5
	body := strings.Repeat("x", 80)
	if err := st.Put(ctx, "slow", strings.NewReader(body), objectstore.PutOptions{Size: int64(len(body))}); err != nil {
		t.Fatalf("a slow store that reads on: %v", err)
	}
	h.readStep = 0
	// The caller's body takes twice d per read: not the store's stall.
	if err := st.Put(ctx, "caller", &slowReader{r: strings.NewReader("abcdefgh"), step: 2 * d}, objectstore.PutOptions{Size: 8}); err != nil {
		t.Fatalf("a caller's slow body: %v", err)
	}
	// A Get whose body hangs mid-way; a caller that pauses between reads.
	rc, err := st.Get(ctx, "slow")
	if err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 8)
	if _, err := rc.Read(p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * d)
	if _, err := rc.Read(p); err != nil {
		t.Fatalf("a read after the caller paused: %v", err)
	}
	h.hang.Store(1)
	_, err = rc.Read(p)
	stalled("a read of a body that stopped coming", err)
	rc.Close()
	// A List callback that takes its time.
	n := 0
	if err := st.List(ctx, "", func(objectstore.ObjectInfo) error { time.Sleep(2 * d); n++; return nil }); err != nil || n != 2 {
		t.Fatalf("a slow List callback: %d objects, %v", n, err)
	}

	// The caller's own cancellation is not a stall.
	h.hang.Store(1)
	cctx, cancel := context.WithTimeout(ctx, d/3)
	defer cancel()
	if err := st.Delete(cctx, "k"); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, objectstore.ErrStalled) {
		t.Fatalf("a cancelled caller: %v", err)
	}
	h.hang.Store(0)

	// Under WithRetry the attempt after a stall succeeds.
	r := objectstore.WithRetry(st, objectstore.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}, zerolog.Nop())
	h.hang.Store(1)
	if err := r.Put(ctx, "retried", strings.NewReader("abc"), objectstore.PutOptions{Size: 3}); err != nil {
		t.Fatalf("a put retried after a stall: %v", err)
	}
	if h.hang.Load() != 0 {
		t.Fatal("the first attempt did not hang")
	}
}

// TestStallTimeoutAcceptance: the wrapper keeps the Store contract.
func TestStallTimeoutAcceptance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) objectstore.Store {
		return objectstore.WithStallTimeout(objectstore.NewMemory(), time.Minute)
	})
}
