package agent

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/plugins/cache/lfc"
	"github.com/stratadb/strata/plugins/cache/sharedbuffers"
	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

// Cache strategies (Config.Cache.Strategy).
const (
	StrategyLFC           = sharedbuffers.StrategyLFC
	StrategySharedBuffers = sharedbuffers.StrategySharedBuffers
)

// CacheConfig is the compute's cache tiers: one memory budget split by the
// strategy (plugins/cache/sharedbuffers.Plan), so that an A/B of the two
// strategies compares equal memory.
type CacheConfig struct {
	// Strategy is "lfc" (a small shared_buffers in front of the LFC) or
	// "shared-buffers" (no LFC; shared_buffers gets the share).
	Strategy string
	// MemoryBudget is the compute's memory in bytes.
	MemoryBudget int64
	// LFC configures the LFC (its size comes from the plan).
	LFC lfc.Config
	// SharedBuffers configures the split (fraction, minimum, huge pages).
	SharedBuffers sharedbuffers.Config
	// Prewarm, under lfc (with an object store in Config.Archive): after
	// every start the agent reads the pages of the timeline's saved page
	// list into the LFC (core/compute/prewarm), and it saves the LFC's pages
	// as the new list every PrewarmInterval (default 5 minutes) and when it
	// stops. Under shared-buffers: Postgres' autoprewarm (pg_prewarm) with
	// PrewarmInterval as its dump interval.
	Prewarm         bool
	PrewarmInterval time.Duration
	// Advisor, under lfc, is an external cache advisor plugin that resizes
	// the LFC once a period within the plan's LFC size (nil: none).
	Advisor *AdvisorConfig
}

// Plan returns the sizing of c.
func (c CacheConfig) Plan() (sharedbuffers.Sizing, error) {
	return sharedbuffers.Planner{}.Plan(c.MemoryBudget, c.Strategy, c.SharedBuffers)
}

// tier adapts a cache.Cache (the LFC) to the filesystem's Cache hook.
//
// Puts carry pg.InvalidLSN, which always overwrites: the filesystem puts a
// page both when Postgres writes it and when a miss fills it, and a write is
// authoritative even when its page LSN is lower than the cached one (a
// reinitialized page). Postgres orders the fill and the write of one block
// (one buffer, its I/O lock), so a stale fill cannot overtake a write.
type tier struct {
	c   cache.Cache
	log zerolog.Logger
}

var _ fusefs.Cache = tier{}

func (t tier) Get(key pg.PageKey, page []byte) bool {
	hit, err := t.c.Get(key, page)
	if err != nil {
		t.log.Warn().Err(err).Str("page", key.String()).Msg("cache tier read failed; reading from storage")
		return false
	}
	return hit
}

func (t tier) Put(key pg.PageKey, page []byte) {
	if err := t.c.Put(key, page, pg.InvalidLSN); err != nil {
		// The page is not cached (the tier dropped it); reads go to storage.
		t.log.Warn().Err(err).Str("page", key.String()).Msg("cache tier write failed")
	}
}

func (t tier) Forget(rel pg.RelTag, from uint32) {
	if err := t.c.InvalidateRel(rel, from); err != nil {
		t.log.Error().Err(err).Str("rel", rel.String()).Msg("cache tier invalidation failed")
	}
}

// newLFC builds the LFC of the plan, or nil under "shared-buffers".
func newLFC(c CacheConfig, s sharedbuffers.Sizing, scratch string, waits *cache.Waits, log zerolog.Logger) (*lfc.Cache, error) {
	if c.Strategy != StrategyLFC {
		return nil, nil
	}
	cfg := c.LFC
	cfg.SizeBytes = s.LFCBytes
	if cfg.Tier == lfc.TierDisk && cfg.Path == "" {
		cfg.Path = filepath.Join(scratch, "lfc.cache")
	}
	l, err := lfc.New(cfg, lfc.Options{Logger: log, Waits: waits})
	if err != nil {
		return nil, fmt.Errorf("agent: LFC: %w", err)
	}
	return l, nil
}
