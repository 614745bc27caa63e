package cachetest

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

// OpenAdvisor returns a fresh advisor (the suite calls it once per case).
type OpenAdvisor func(t *testing.T) cache.Advisor

// RunAdvisor is the acceptance suite of the cache.Advisor contract. Every
// advisor runs it, in process and, for an external plugin, through the
// process boundary (core/compute/agent runs it against the built
// examples/cache-advisor):
//
//	func TestAdvisorAcceptance(t *testing.T) {
//		cachetest.RunAdvisor(t, func(t *testing.T) cache.Advisor { return myAdvisor(defaults) })
//	}
//
// It asserts what a host relies on: advice within [0, budget], no error on
// the first period or when counters go back to zero (a new LFC after a
// restart of Postgres), a prompt return when the context is cancelled, safe
// concurrent calls, and a working loop with cache.RunAdvisor. Run it under
// -race.
func RunAdvisor(t *testing.T, open OpenAdvisor) {
	t.Run("FirstPeriod", func(t *testing.T) { advisorFirstPeriod(t, open(t)) })
	t.Run("WithinBudget", func(t *testing.T) { advisorWithinBudget(t, open(t)) })
	t.Run("CountersReset", func(t *testing.T) { advisorCountersReset(t, open(t)) })
	t.Run("CancelledContext", func(t *testing.T) { advisorCancelled(t, open(t)) })
	t.Run("Concurrent", func(t *testing.T) { advisorConcurrent(t, open(t)) })
	t.Run("DrivesACache", func(t *testing.T) { advisorDrives(t, open(t)) })
}

// checkAdvice fails t when adv asks for a capacity outside [0, budget].
func checkAdvice(t *testing.T, what string, adv cache.Advice, budget int64) {
	t.Helper()
	if adv.Resize && (adv.CapacityBytes < 0 || adv.CapacityBytes > budget) {
		t.Fatalf("%s: asks for %d bytes, outside [0, %d]", what, adv.CapacityBytes, budget)
	}
}

func advisorFirstPeriod(t *testing.T, a cache.Advisor) {
	ctx := context.Background()
	// The first call of a loop: Prev is zero, the cache new and empty.
	obs := cache.Observation{Stats: cache.Stats{CapacityBytes: 64 << 20}, Period: 5 * time.Second, BudgetBytes: 64 << 20}
	adv, err := a.Advise(ctx, obs)
	if err != nil {
		t.Fatalf("first period: %v", err)
	}
	checkAdvice(t, "first period", adv, obs.BudgetBytes)
	// A period of zero length (two ticks at once) is no error either.
	obs.Prev, obs.Period = obs.Stats, 0
	adv, err = a.Advise(ctx, obs)
	if err != nil {
		t.Fatalf("zero-length period: %v", err)
	}
	checkAdvice(t, "zero-length period", adv, obs.BudgetBytes)
}

// randomObservation is a plausible period of a cache of at most budget
// bytes: counters that grew since prev, any fill, waits.
func randomObservation(rng *rand.Rand, budget int64, prev cache.Stats) cache.Observation {
	capacity := rng.Int64N(budget+1) / pg.BlockSize * pg.BlockSize
	used := int64(0)
	if capacity > 0 {
		used = rng.Int64N(capacity+1) / pg.BlockSize * pg.BlockSize
	}
	st := cache.Stats{
		Hits: prev.Hits + rng.Uint64N(100000), Misses: prev.Misses + rng.Uint64N(10000),
		Puts: prev.Puts + rng.Uint64N(10000), StalePuts: prev.StalePuts + rng.Uint64N(10),
		Evictions: prev.Evictions + rng.Uint64N(3)*rng.Uint64N(5000), Invalidations: prev.Invalidations + rng.Uint64N(100),
		Pages: used / pg.BlockSize, UsedBytes: used, CapacityBytes: capacity,
	}
	return cache.Observation{Stats: st, Prev: prev, Period: time.Duration(1+rng.IntN(10)) * time.Second, BudgetBytes: budget,
		Waits: []cache.WaitStat{{Name: cache.WaitLFCLock, Count: rng.Int64N(1000), Total: time.Duration(rng.IntN(1e6))}}}
}

func advisorWithinBudget(t *testing.T, a cache.Advisor) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	for _, budget := range []int64{0, pg.BlockSize, 1 << 20, 64 << 20, 8 << 30} {
		var prev cache.Stats
		for i := 0; i < 200; i++ {
			obs := randomObservation(rng, budget, prev)
			adv, err := a.Advise(ctx, obs)
			if err != nil {
				t.Fatalf("budget %d, period %d: %v", budget, i, err)
			}
			checkAdvice(t, "a period", adv, budget)
			prev = obs.Stats
		}
	}
}

func advisorCountersReset(t *testing.T, a cache.Advisor) {
	ctx := context.Background()
	big := cache.Stats{Hits: 1e9, Misses: 1e8, Puts: 1e8, Evictions: 1e7, Pages: 1000, UsedBytes: 1000 * pg.BlockSize, CapacityBytes: 2000 * pg.BlockSize}
	// Counters below Prev: the host started a new cache.
	obs := cache.Observation{Stats: cache.Stats{CapacityBytes: 2000 * pg.BlockSize}, Prev: big, Period: time.Second, BudgetBytes: 4000 * pg.BlockSize}
	adv, err := a.Advise(ctx, obs)
	if err != nil {
		t.Fatalf("counters below the previous period's: %v", err)
	}
	checkAdvice(t, "counters reset", adv, obs.BudgetBytes)
}

func advisorCancelled(t *testing.T, a cache.Advisor) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	type result struct {
		adv cache.Advice
		err error
	}
	done := make(chan result, 1)
	go func() {
		adv, err := a.Advise(ctx, cache.Observation{Stats: cache.Stats{CapacityBytes: 1 << 20}, Period: time.Second, BudgetBytes: 1 << 20})
		done <- result{adv, err}
	}()
	select {
	case r := <-done:
		if r.err == nil {
			checkAdvice(t, "cancelled context", r.adv, 1<<20)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Advise with a cancelled context did not return within 10s")
	}
}

func advisorConcurrent(t *testing.T, a cache.Advisor) {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 7))
			var prev cache.Stats
			for i := 0; i < 50; i++ {
				obs := randomObservation(rng, 256<<20, prev)
				adv, err := a.Advise(ctx, obs)
				if err != nil {
					errs <- err
					return
				}
				if adv.Resize && (adv.CapacityBytes < 0 || adv.CapacityBytes > obs.BudgetBytes) {
					errs <- errors.New("advice outside the budget under concurrent calls")
					return
				}
				prev = obs.Stats
			}
		}(uint64(g))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// advisorDrives runs the advisor in cache.RunAdvisor over the Memory cache
// while pages come and go, and checks that the loop keeps the capacity in
// the budget and ends with the context.
func advisorDrives(t *testing.T, a cache.Advisor) {
	const budget = 256 * pg.BlockSize
	c, err := cache.NewMemory(budget)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	loop := make(chan error, 1)
	go func() {
		loop <- cache.RunAdvisor(ctx, c, a, cache.AdvisorOptions{Every: 20 * time.Millisecond, BudgetBytes: budget})
	}()
	page := make([]byte, pg.BlockSize)
	for i := 0; ctx.Err() == nil; i++ {
		_ = c.Put(pg.PageKey{Spc: 1663, DB: 5, Rel: 16384, Block: uint32(i % 1024)}, page, pg.LSN(i+1))
		if i%64 == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	if err := <-loop; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RunAdvisor ended with %v, want the context's end", err)
	}
	if capacity := c.Stats().CapacityBytes; capacity < 0 || capacity > budget {
		t.Fatalf("capacity %d after the loop, outside [0, %d]", capacity, budget)
	}
}
