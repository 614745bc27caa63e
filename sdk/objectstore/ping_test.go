package objectstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
)

// TestPing: a store that answers (a missing key is an answer) passes; one
// that hangs fails at the context's deadline, one that fails with its
// error.
func TestPing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := objectstore.Ping(ctx, objectstore.NewMemory()); err != nil {
		t.Fatalf("a store that answers NotFound: %v", err)
	}

	hung := faulty.New(objectstore.NewMemory(), faulty.Config{Rules: []faulty.Rule{{Fault: faulty.Delay, Latency: time.Hour}}})
	hctx, hcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer hcancel()
	start := time.Now()
	err := objectstore.Ping(hctx, hung)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a store that does not answer: %v, want the deadline", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the ping took %s, past its 200 ms deadline", took)
	}

	broken := faulty.New(objectstore.NewMemory(), faulty.Config{Rules: []faulty.Rule{{Ops: faulty.OpStat}}})
	if err := objectstore.Ping(ctx, broken); !errors.Is(err, faulty.ErrInjected) {
		t.Fatalf("a store that fails the question: %v, want the injected error", err)
	}
}
