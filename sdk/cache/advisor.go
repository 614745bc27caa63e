package cache

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// Advisor makes batched decisions for a cache off the per-page path: it is
// called every few seconds with what the cache and the agent observed, and
// answers with the capacity the cache should have. It is the part of a cache
// plugin that may run out of process (an external plugin is called once a
// period, never once a page).
//
// Advise must not keep obs after it returns. An error leaves the cache as
// it is; the next period asks again.
type Advisor interface {
	Advise(ctx context.Context, obs Observation) (Advice, error)
}

// Observation is what an Advisor is told each period.
type Observation struct {
	// Stats is the cache's counters and sizes now; Prev the same at the
	// last observation the advisor answered (zero on the first call; a
	// period earlier unless a call failed), so rates are Stats - Prev.
	Stats, Prev Stats
	// Period is the time between Prev and Stats.
	Period time.Duration
	// Waits is the agent's wait accounting now (nil if not kept).
	Waits []WaitStat
	// BudgetBytes is the most the cache may be given.
	BudgetBytes int64
}

// Advice is an Advisor's answer.
type Advice struct {
	// Resize asks for the capacity to become CapacityBytes (clamped to
	// [0, BudgetBytes]). False keeps the capacity.
	Resize        bool
	CapacityBytes int64
}

// AdvisorOptions configure RunAdvisor.
type AdvisorOptions struct {
	Every       time.Duration // period, default 5s
	BudgetBytes int64         // upper bound of any capacity
	Waits       *Waits        // optional, passed to the advisor
	Logger      zerolog.Logger
}

// RunAdvisor asks a for advice every period and resizes c accordingly, until
// ctx ends (it then returns ctx.Err()). Advisor errors are logged and
// skipped; a Resize error other than ErrClosed is logged; ErrClosed ends the
// loop and is returned.
func RunAdvisor(ctx context.Context, c Cache, a Advisor, o AdvisorOptions) error {
	if o.Every <= 0 {
		o.Every = 5 * time.Second
	}
	if o.BudgetBytes < 0 {
		return fmt.Errorf("%w: budget %d", ErrBadSize, o.BudgetBytes)
	}
	log := o.Logger.With().Str("component", "cache-advisor").Logger()
	t := time.NewTicker(o.Every)
	defer t.Stop()
	var prev Stats
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-t.C:
			obs := Observation{Stats: c.Stats(), Prev: prev, Period: now.Sub(last),
				Waits: o.Waits.Snapshot(), BudgetBytes: o.BudgetBytes}
			adv, err := a.Advise(ctx, obs)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				// Prev stays: the next observation spans this period too,
				// so what happened while the advisor was down (a plugin
				// being launched again) still reaches it.
				log.Warn().Err(err).Msg("cache advisor failed; keeping the capacity")
				continue
			}
			prev, last = obs.Stats, now
			if !adv.Resize {
				continue
			}
			size := min(max(adv.CapacityBytes, 0), o.BudgetBytes)
			if size == obs.Stats.CapacityBytes {
				continue
			}
			if err := c.Resize(size); err != nil {
				if errors.Is(err, ErrClosed) {
					return err
				}
				log.Warn().Err(err).Int64("bytes", size).Msg("cache resize failed")
				continue
			}
			log.Info().Int64("from_bytes", obs.Stats.CapacityBytes).Int64("to_bytes", size).Msg("cache resized on advice")
		}
	}
}
