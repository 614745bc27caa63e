package cache_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

// scripted answers from a list and records what it was told.
type scripted struct {
	mu      sync.Mutex
	answers []cache.Advice
	errs    []error
	seen    []cache.Observation
	done    chan struct{}
	during  map[int]func() // run during the i-th call
}

func (s *scripted) Advise(_ context.Context, obs cache.Observation) (cache.Advice, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := len(s.seen)
	s.seen = append(s.seen, obs)
	if i == len(s.answers)-1 {
		close(s.done)
	}
	if f := s.during[i]; f != nil {
		f()
	}
	if i >= len(s.answers) {
		return cache.Advice{}, nil
	}
	return s.answers[i], s.errs[i]
}

func TestRunAdvisor(t *testing.T) {
	c, _ := cache.NewMemory(100 * pg.BlockSize)
	w, _ := cache.NewWaits("getpage")
	w.Add(0, 0, time.Millisecond)
	k := pg.PageKey{Rel: 1}
	_ = c.Put(k, make([]byte, pg.BlockSize), 0)
	_, _ = c.Get(k, make([]byte, pg.BlockSize))
	a := &scripted{
		answers: []cache.Advice{
			{Resize: true, CapacityBytes: 10 * pg.BlockSize}, // shrink
			{},                                     // keep
			{Resize: true, CapacityBytes: 1 << 40}, // clamped to the budget
			{Resize: true, CapacityBytes: 1},       // rejected by nobody: rounds to 0 pages
		},
		errs: []error{nil, nil, errors.New("advisor down"), nil},
		done: make(chan struct{}),
	}
	// The third answer comes with an error: it must be ignored.
	a.answers[2] = cache.Advice{Resize: true, CapacityBytes: 1 << 40}
	// A hit after the second observation: the third sees it, and its call
	// fails; the fourth must still see it (Stats - Prev).
	a.during = map[int]func(){1: func() { _, _ = c.Get(k, make([]byte, pg.BlockSize)) }}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- cache.RunAdvisor(ctx, c, a, cache.AdvisorOptions{Every: 5 * time.Millisecond,
			BudgetBytes: 50 * pg.BlockSize, Waits: w, Logger: zerolog.Nop()})
	}()
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("advisor not called 4 times")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunAdvisor: %v", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	o := a.seen
	if o[0].Stats.Hits != 1 || o[0].Prev.Hits != 0 || o[0].BudgetBytes != 50*pg.BlockSize ||
		len(o[0].Waits) != 1 || o[0].Waits[0].Count != 1 || o[0].Period <= 0 {
		t.Fatalf("first observation %+v", o[0])
	}
	if o[1].Stats.CapacityBytes != 10*pg.BlockSize || o[1].Prev.CapacityBytes != 100*pg.BlockSize {
		t.Fatalf("shrink not applied: %+v", o[1])
	}
	if o[3].Stats.CapacityBytes != 10*pg.BlockSize {
		t.Fatalf("an answer with an error was applied: %+v", o[3].Stats)
	}
	// The observation after a failed call spans both periods: nothing
	// that happened while the advisor was down is lost to it.
	if o[3].Prev != o[1].Stats || o[3].Stats.Hits-o[3].Prev.Hits != 1 || o[3].Period <= o[2].Period {
		t.Fatalf("after a failed call: Prev %+v (want the last answered %+v), period %s (the failed one's %s)", o[3].Prev, o[1].Stats, o[3].Period, o[2].Period)
	}
	if got := c.Stats().CapacityBytes; got != 0 {
		t.Fatalf("capacity %d after the last advice (1 byte)", got)
	}

	// Clamping to the budget.
	c2, _ := cache.NewMemory(0)
	a2 := &scripted{answers: []cache.Advice{{Resize: true, CapacityBytes: 1 << 40}, {}}, errs: []error{nil, nil}, done: make(chan struct{})}
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() {
		errc <- cache.RunAdvisor(ctx2, c2, a2, cache.AdvisorOptions{Every: time.Millisecond, BudgetBytes: 7 * pg.BlockSize})
	}()
	<-a2.done
	cancel2()
	<-errc
	if got := c2.Stats().CapacityBytes; got != 7*pg.BlockSize {
		t.Fatalf("capacity %d, want the 7-page budget", got)
	}

	// A closed cache ends the loop with ErrClosed.
	_ = c2.Close()
	a3 := &scripted{answers: []cache.Advice{{Resize: true, CapacityBytes: pg.BlockSize}}, errs: []error{nil}, done: make(chan struct{})}
	err := cache.RunAdvisor(context.Background(), c2, a3, cache.AdvisorOptions{Every: time.Millisecond, BudgetBytes: 1 << 20})
	if !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("RunAdvisor on a closed cache: %v", err)
	}
}
