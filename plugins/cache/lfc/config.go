package lfc

import (
	"fmt"
	"slices"

	"github.com/stratadb/strata/plugins/cache/lfc/policy"
)

// Tiers.
const (
	TierRAM  = "ram"
	TierDisk = "disk"
)

// MaxChunkPages is the largest chunk (128 pages = 1 MiB, Neon's LFC chunk).
const MaxChunkPages = 128

// Config is the LFC's configuration, mounted at compute.cache.lfc.
type Config struct {
	// SizeBytes is the capacity. It can change at run time (Cache.Resize).
	// It is not a config key: a strata compute takes it from its memory
	// budget (plugins/cache/sharedbuffers.Plan), so a size in the file
	// would be overwritten without a word; the loader refuses the key.
	SizeBytes int64 `mapstructure:"-" json:"size_bytes"`
	// Tier is "ram" (pages in the agent's heap) or "disk" (one
	// preallocated file of chunk slots, read and written with pread and
	// pwrite).
	Tier string `mapstructure:"tier" json:"tier"`
	// Path is the disk tier's file. It is created (truncated) by New and
	// removed by Close: the LFC does not survive a restart.
	Path string `mapstructure:"path" json:"path"`
	// ChunkPages is the allocation and eviction unit, in consecutive
	// blocks of one relation fork: 1 (the default) gives per-page slots,
	// 128 reproduces Neon's 1 MiB chunks.
	ChunkPages int `mapstructure:"chunk_pages" json:"chunk_pages"`
	// Partitions is the number of lock partitions. 1 reproduces the single
	// LFC lock whose contention Lakebase measured; more removes it.
	Partitions int `mapstructure:"partitions" json:"partitions"`
	// Policy is the eviction policy: "lru", "clock" or "s3fifo"
	// (scan-resistant).
	Policy string `mapstructure:"policy" json:"policy"`
}

// DefaultConfig returns the defaults: 256 MiB in RAM, per-page slots, 64
// partitions, S3-FIFO.
func DefaultConfig() Config {
	return Config{
		SizeBytes:  256 << 20,
		Tier:       TierRAM,
		ChunkPages: 1,
		Partitions: 64,
		Policy:     "s3fifo",
	}
}

// Validate checks the configuration; its messages name the key below
// compute.cache ("lfc.partitions: must be >= 1").
func (c Config) Validate() error {
	if c.SizeBytes < 0 {
		return fmt.Errorf("lfc.size_bytes: must be >= 0, got %d", c.SizeBytes)
	}
	switch c.Tier {
	case TierRAM:
	case TierDisk:
		if c.Path == "" {
			return fmt.Errorf("lfc.path: required when lfc.tier is %q", TierDisk)
		}
	default:
		return fmt.Errorf("lfc.tier: must be %q or %q, got %q", TierRAM, TierDisk, c.Tier)
	}
	if c.ChunkPages < 1 || c.ChunkPages > MaxChunkPages {
		return fmt.Errorf("lfc.chunk_pages: must be between 1 and %d, got %d", MaxChunkPages, c.ChunkPages)
	}
	if c.Partitions < 1 {
		return fmt.Errorf("lfc.partitions: must be >= 1, got %d", c.Partitions)
	}
	if c.Partitions > 4096 {
		return fmt.Errorf("lfc.partitions: must be <= 4096, got %d", c.Partitions)
	}
	if !slices.Contains(policy.Names, c.Policy) {
		return fmt.Errorf("lfc.policy: must be one of %v, got %q", policy.Names, c.Policy)
	}
	return nil
}

// ChunkBytes is the size of one chunk slot.
func (c Config) ChunkBytes() int64 { return int64(c.ChunkPages) * 8192 }
