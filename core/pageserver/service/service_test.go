package service

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
)

// TestStoreAnswers: the shutdown publish asks the store one question
// first; a store that answers (a missing key is an answer) gets the
// publish, one that hangs or fails does not.
func TestStoreAnswers(t *testing.T) {
	mem := objectstore.NewMemory()
	if err := storeAnswers(mem, time.Second); err != nil {
		t.Fatalf("a store that answers NotFound: %v", err)
	}

	hung := faulty.New(objectstore.NewMemory(), faulty.Config{Rules: []faulty.Rule{{Fault: faulty.Delay, Latency: time.Hour}}})
	start := time.Now()
	err := storeAnswers(hung, 200*time.Millisecond)
	if err == nil {
		t.Fatal("a store that does not answer passed")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("the question took %s, past its 200 ms limit", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a store that does not answer: %v, want the deadline", err)
	}
	if err := storeAnswers(nil, time.Second); err != nil {
		t.Fatalf("no store: %v", err)
	}

	broken := faulty.New(objectstore.NewMemory(), faulty.Config{Rules: []faulty.Rule{{Ops: faulty.OpStat}}})
	if err := storeAnswers(broken, time.Second); !errors.Is(err, faulty.ErrInjected) {
		t.Fatalf("a store that fails the question: %v, want the injected error", err)
	}
}
