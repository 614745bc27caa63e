// Package sharedbuffers is the cache strategy that gives the compute's
// memory to Postgres' own buffer pool instead of the LFC, and the sizing
// logic both strategies share: from one memory budget, how big
// shared_buffers and the LFC are, and whether Postgres should use huge pages.
//
// Both strategies give the same share of the budget (Config.Fraction) to
// page caching, so that an A/B compares equal memory:
//
//	strategy "shared-buffers": shared_buffers = fraction*budget, no LFC
//	strategy "lfc":            shared_buffers = min_bytes,
//	                           LFC = fraction*budget - min_bytes
//
// The rest of the budget is left to Postgres' backends (work_mem,
// maintenance_work_mem, catalog caches) and the agent.
//
// shared_buffers cannot change while Postgres runs: resizing it means a fast
// restart of Postgres (NeedsRestart tells when), whereas the LFC resizes live
// (cache.Cache.Resize). This package only computes; it starts nothing.
package sharedbuffers

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/stratadb/strata/sdk/pg"
)

// Strategies.
const (
	StrategyLFC           = "lfc"
	StrategySharedBuffers = "shared-buffers"
)

// Huge page settings (Postgres' huge_pages GUC values, plus "auto").
const (
	HugePagesAuto = "auto" // detect: "try" if the host offers huge pages, else "off"
	HugePagesTry  = "try"
	HugePagesOn   = "on"
	HugePagesOff  = "off"
)

// MinSharedBuffersPages is Postgres' lower bound for shared_buffers (16
// buffers, 128 kB).
const MinSharedBuffersPages = 16

// ErrBudget: the memory budget is too small for the plan.
var ErrBudget = errors.New("sharedbuffers: memory budget too small")

// Config is the sizing configuration, mounted at compute.cache.shared_buffers.
type Config struct {
	// Fraction of the memory budget given to page caching (shared_buffers
	// under "shared-buffers", shared_buffers plus LFC under "lfc").
	Fraction float64 `mapstructure:"fraction" json:"fraction"`
	// MinBytes is shared_buffers under the "lfc" strategy (Postgres still
	// needs a buffer pool; the LFC is behind it).
	MinBytes int64 `mapstructure:"min_bytes" json:"min_bytes"`
	// HugePages is "auto", "try", "on" or "off".
	HugePages string `mapstructure:"huge_pages" json:"huge_pages"`
}

// DefaultConfig returns the defaults: 75% of the budget, 16 MiB of
// shared_buffers in front of an LFC, huge pages detected.
func DefaultConfig() Config {
	return Config{Fraction: 0.75, MinBytes: 16 << 20, HugePages: HugePagesAuto}
}

// Validate checks the configuration; its messages name the key below
// compute.cache.
func (c Config) Validate() error {
	if !(c.Fraction > 0 && c.Fraction <= 1) {
		return fmt.Errorf("shared_buffers.fraction: must be in (0, 1], got %v", c.Fraction)
	}
	if c.MinBytes < MinSharedBuffersPages*pg.BlockSize {
		return fmt.Errorf("shared_buffers.min_bytes: must be >= %d (16 pages), got %d",
			MinSharedBuffersPages*pg.BlockSize, c.MinBytes)
	}
	switch c.HugePages {
	case HugePagesAuto, HugePagesTry, HugePagesOn, HugePagesOff:
	default:
		return fmt.Errorf("shared_buffers.huge_pages: must be auto, try, on or off, got %q", c.HugePages)
	}
	return nil
}

// Sizing is the outcome of Plan.
type Sizing struct {
	Strategy    string
	BudgetBytes int64
	// SharedBuffers is Postgres' shared_buffers, in 8 kB pages.
	SharedBuffers int64
	// LFCBytes is the LFC's capacity (0 under "shared-buffers").
	LFCBytes int64
	// HugePages is the huge_pages setting: "try", "on" or "off".
	HugePages string
}

// SharedBuffersBytes is SharedBuffers in bytes.
func (s Sizing) SharedBuffersBytes() int64 { return s.SharedBuffers * pg.BlockSize }

// Settings returns the Postgres settings of the plan (shared_buffers as a
// number of 8 kB buffers, as postgresql.conf takes it without a unit).
func (s Sizing) Settings() map[string]string {
	return map[string]string{
		"shared_buffers": strconv.FormatInt(s.SharedBuffers, 10),
		"huge_pages":     s.HugePages,
	}
}

// NeedsRestart reports whether moving from old to new needs Postgres to
// restart (shared_buffers or huge_pages changed). An LFC-only change does
// not: the LFC is resized live.
func NeedsRestart(old, new Sizing) bool {
	return old.SharedBuffers != new.SharedBuffers || old.HugePages != new.HugePages
}

// Planner computes sizings. Its zero value reads the host's /proc and /sys.
type Planner struct {
	// ReadFile reads a host file (default os.ReadFile); tests inject one.
	ReadFile func(string) ([]byte, error)
}

// Plan sizes shared_buffers and the LFC for budget bytes with the default
// configuration except fraction, detecting huge pages on this host.
func Plan(budget int64, strategy string, fraction float64) (Sizing, error) {
	cfg := DefaultConfig()
	cfg.Fraction = fraction
	return Planner{}.Plan(budget, strategy, cfg)
}

// Plan sizes shared_buffers and the LFC for budget bytes.
func (p Planner) Plan(budget int64, strategy string, cfg Config) (Sizing, error) {
	if err := cfg.Validate(); err != nil {
		return Sizing{}, err
	}
	s := Sizing{Strategy: strategy, BudgetBytes: budget}
	share := int64(float64(budget) * cfg.Fraction)
	switch strategy {
	case StrategySharedBuffers:
		s.SharedBuffers = share / pg.BlockSize
	case StrategyLFC:
		s.SharedBuffers = cfg.MinBytes / pg.BlockSize
		s.LFCBytes = share - s.SharedBuffers*pg.BlockSize
	default:
		return Sizing{}, fmt.Errorf("sharedbuffers: unknown strategy %q (want %q or %q)",
			strategy, StrategyLFC, StrategySharedBuffers)
	}
	if s.SharedBuffers < MinSharedBuffersPages || s.LFCBytes < 0 {
		return Sizing{}, fmt.Errorf("%w: %d bytes at fraction %v cannot hold shared_buffers of %d bytes",
			ErrBudget, budget, cfg.Fraction, max(s.SharedBuffers, MinSharedBuffersPages)*pg.BlockSize)
	}
	s.HugePages = cfg.HugePages
	if s.HugePages == HugePagesAuto {
		s.HugePages = HugePagesOff
		if p.hugePagesAvailable() {
			s.HugePages = HugePagesTry
		}
	}
	return s, nil
}

// hugePagesAvailable reports whether the host has explicit huge pages
// (HugePages_Total > 0 in /proc/meminfo) or transparent huge pages enabled
// ("always" or "madvise" selected). Unreadable files count as "no".
func (p Planner) hugePagesAvailable() bool {
	read := p.ReadFile
	if read == nil {
		read = os.ReadFile
	}
	if b, err := read("/proc/meminfo"); err == nil {
		if n, ok := meminfoField(b, "HugePages_Total"); ok && n > 0 {
			return true
		}
	}
	if b, err := read("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil {
		s := string(b)
		if strings.Contains(s, "[always]") || strings.Contains(s, "[madvise]") {
			return true
		}
	}
	return false
}

// meminfoField returns the number after "name:" in /proc/meminfo text.
func meminfoField(b []byte, name string) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != name {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		return n, err == nil
	}
	return 0, false
}
