// Command cache-advisor is a minimal external cache advisor plugin for
// strata: it sizes the compute's local file cache (LFC) from what the
// cache saw in the last period. It grows the LFC by a step when it had to
// evict pages, and gives memory back when the LFC stays mostly empty for a
// while.
// Integrators copy it as the starting point of their own advisor; strata's
// tests run it through a real process boundary (core/compute/agent).
//
// An advisor is asked once a period (compute.cache.advisor.every), never
// once a page: it makes batched decisions off the data path.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/cache"
)

// config is this plugin's config section (compute.cache.advisor.plugin.config
// in strata's YAML, handed over as JSON). Unknown keys are refused so that
// typos show.
type config struct {
	// GrowStep is the share of the budget added when the LFC evicted pages
	// in the period (default 0.25).
	GrowStep float64 `json:"grow_step"`
	// LowWatermark: when less than this share of the capacity is in use
	// and nothing was evicted, the LFC shrinks (default 0.5).
	LowWatermark float64 `json:"low_watermark"`
	// Headroom is kept above the bytes in use when the LFC shrinks
	// (default 0.25: a shrink leaves 1.25 times what is used).
	Headroom float64 `json:"headroom"`
	// MinBytes is the smallest capacity it asks for (default 16 MiB).
	MinBytes int64 `json:"min_bytes"`
	// ShrinkAfter is how many periods in a row the LFC must have been
	// mostly empty, with no growth in between, before it shrinks
	// (default 12: a minute at the default period). It keeps the advisor
	// from giving back memory that a warming cache or a burst needs again
	// a moment later.
	ShrinkAfter int `json:"shrink_after"`
}

func defaults() config {
	return config{GrowStep: 0.25, LowWatermark: 0.5, Headroom: 0.25, MinBytes: 16 << 20, ShrinkAfter: 12}
}

func (c config) validate() error {
	switch {
	case c.GrowStep <= 0 || c.GrowStep > 1:
		return fmt.Errorf("grow_step %g: want (0, 1]", c.GrowStep)
	case c.LowWatermark < 0 || c.LowWatermark >= 1:
		return fmt.Errorf("low_watermark %g: want [0, 1)", c.LowWatermark)
	case c.Headroom < 0:
		return fmt.Errorf("headroom %g: want 0 or more", c.Headroom)
	case c.MinBytes < 0:
		return fmt.Errorf("min_bytes %d: want 0 or more", c.MinBytes)
	case c.ShrinkAfter < 1:
		return fmt.Errorf("shrink_after %d: want 1 or more", c.ShrinkAfter)
	}
	return nil
}

// fit is the advisor: grow on evictions, shrink after a while mostly
// empty. It keeps a little state between periods (a restart of the plugin
// forgets it, which only delays a shrink).
type fit struct {
	cfg config
	log zerolog.Logger

	mu    sync.Mutex
	quiet int // periods in a row mostly empty, with no eviction and no growth
}

// Advise implements cache.Advisor.
func (f *fit) Advise(_ context.Context, obs cache.Observation) (cache.Advice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := obs.Stats
	evicted := st.Evictions - min(obs.Prev.Evictions, st.Evictions)
	if evicted > 0 {
		f.quiet = 0
		if st.CapacityBytes >= obs.BudgetBytes {
			return cache.Advice{}, nil
		}
		step := int64(f.cfg.GrowStep * float64(obs.BudgetBytes))
		to := min(obs.BudgetBytes, st.CapacityBytes+max(step, 1))
		f.log.Info().Uint64("evicted", evicted).Int64("from_bytes", st.CapacityBytes).Int64("to_bytes", to).Msg("cache-advisor: the LFC evicted pages; growing it")
		return cache.Advice{Resize: true, CapacityBytes: to}, nil
	}
	if float64(st.UsedBytes) >= f.cfg.LowWatermark*float64(st.CapacityBytes) {
		f.quiet = 0
		return cache.Advice{}, nil
	}
	f.quiet++
	to := max(f.cfg.MinBytes, int64(float64(st.UsedBytes)*(1+f.cfg.Headroom)))
	if f.quiet < f.cfg.ShrinkAfter || to >= st.CapacityBytes {
		return cache.Advice{}, nil
	}
	f.quiet = 0
	f.log.Info().Int64("used_bytes", st.UsedBytes).Int64("from_bytes", st.CapacityBytes).Int64("to_bytes", to).Msg("cache-advisor: the LFC has been mostly empty for a while; shrinking it")
	return cache.Advice{Resize: true, CapacityBytes: to}, nil
}

func open(configJSON []byte, log zerolog.Logger) (cache.Advisor, error) {
	cfg := defaults()
	if len(bytes.TrimSpace(configJSON)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(configJSON))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return nil, fmt.Errorf("cache-advisor: config: %w", err)
		}
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("cache-advisor: config: %w", err)
	}
	log.Info().Float64("grow_step", cfg.GrowStep).Float64("low_watermark", cfg.LowWatermark).Int64("min_bytes", cfg.MinBytes).Int("shrink_after", cfg.ShrinkAfter).Msg("cache-advisor: serving")
	return &fit{cfg: cfg, log: log}, nil
}

func main() { cache.ServeAdvisorPlugin(open) }
