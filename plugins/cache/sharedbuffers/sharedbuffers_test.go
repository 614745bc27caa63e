package sharedbuffers

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

// host fakes /proc/meminfo and the THP switch.
func host(hugeTotal, thp string) Planner {
	return Planner{ReadFile: func(name string) ([]byte, error) {
		switch name {
		case "/proc/meminfo":
			return []byte("MemTotal:        8000000 kB\nHugePages_Total:    " + hugeTotal + "\nHugePages_Free:       0\nHugepagesize:       2048 kB\n"), nil
		case "/sys/kernel/mm/transparent_hugepage/enabled":
			if thp == "" {
				return nil, os.ErrNotExist
			}
			return []byte(thp + "\n"), nil
		}
		return nil, os.ErrNotExist
	}}
}

const noTHP = "always madvise [never]"

func TestPlanSharedBuffers(t *testing.T) {
	cfg := DefaultConfig()
	s, err := host("0", noTHP).Plan(1<<30, StrategySharedBuffers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 75% of 1 GiB = 768 MiB = 98304 pages.
	if s.SharedBuffers != 98304 || s.LFCBytes != 0 || s.HugePages != HugePagesOff {
		t.Fatalf("%+v", s)
	}
	if s.SharedBuffersBytes() != 768<<20 {
		t.Fatalf("bytes %d", s.SharedBuffersBytes())
	}
	if got := s.Settings(); got["shared_buffers"] != "98304" || got["huge_pages"] != "off" {
		t.Fatalf("settings %v", got)
	}
	// A budget that is not a multiple of the page size rounds down.
	cfg.Fraction = 0.5
	s, _ = host("0", noTHP).Plan(1<<20+12345, StrategySharedBuffers, cfg)
	if want := int64((1<<20 + 12345) / 2 / pg.BlockSize); s.SharedBuffers != want {
		t.Fatalf("SharedBuffers %d, want %d", s.SharedBuffers, want)
	}
}

// TestEqualMemory: both strategies give the same bytes to page caching.
func TestEqualMemory(t *testing.T) {
	for _, budget := range []int64{256 << 20, 1 << 30, 3<<30 + 77} {
		for _, f := range []float64{0.25, 0.5, 0.75, 1} {
			cfg := DefaultConfig()
			cfg.Fraction = f
			sb, err1 := host("0", noTHP).Plan(budget, StrategySharedBuffers, cfg)
			lfc, err2 := host("0", noTHP).Plan(budget, StrategyLFC, cfg)
			if err1 != nil || err2 != nil {
				t.Fatal(err1, err2)
			}
			a := sb.SharedBuffersBytes() + sb.LFCBytes
			b := lfc.SharedBuffersBytes() + lfc.LFCBytes
			if d := a - b; d < -pg.BlockSize || d > pg.BlockSize || b > int64(float64(budget)*f) {
				t.Errorf("budget %d fraction %v: shared-buffers caches %d, lfc caches %d", budget, f, a, b)
			}
			if lfc.SharedBuffers != cfg.MinBytes/pg.BlockSize {
				t.Errorf("lfc strategy shared_buffers %d pages", lfc.SharedBuffers)
			}
		}
	}
}

func TestPlanLFC(t *testing.T) {
	s, err := host("0", noTHP).Plan(1<<30, StrategyLFC, DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if s.SharedBuffers != 2048 || s.LFCBytes != 768<<20-16<<20 {
		t.Fatalf("%+v", s)
	}
}

func TestHugePages(t *testing.T) {
	cases := []struct {
		total, thp, cfg, want string
	}{
		{"0", noTHP, HugePagesAuto, HugePagesOff},
		{"0", "", HugePagesAuto, HugePagesOff},
		{"512", noTHP, HugePagesAuto, HugePagesTry},
		{"0", "[always] madvise never", HugePagesAuto, HugePagesTry},
		{"0", "always [madvise] never", HugePagesAuto, HugePagesTry},
		{"512", noTHP, HugePagesOff, HugePagesOff},
		{"0", noTHP, HugePagesOn, HugePagesOn},
	}
	for _, tc := range cases {
		cfg := DefaultConfig()
		cfg.HugePages = tc.cfg
		s, err := host(tc.total, tc.thp).Plan(1<<30, StrategyLFC, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if s.HugePages != tc.want {
			t.Errorf("total=%s thp=%q cfg=%s: %s, want %s", tc.total, tc.thp, tc.cfg, s.HugePages, tc.want)
		}
	}
	// Nothing readable at all: off.
	p := Planner{ReadFile: func(string) ([]byte, error) { return nil, os.ErrPermission }}
	if s, _ := p.Plan(1<<30, StrategyLFC, DefaultConfig()); s.HugePages != HugePagesOff {
		t.Fatalf("unreadable host: %s", s.HugePages)
	}
}

// TestHostDetection runs the real detection against this machine's files
// and checks it agrees with a direct reading of them.
func TestHostDetection(t *testing.T) {
	s, err := Plan(1<<30, StrategySharedBuffers, 0.75)
	if err != nil {
		t.Fatal(err)
	}
	want := HugePagesOff
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if n, ok := meminfoField(b, "HugePages_Total"); ok && n > 0 {
			want = HugePagesTry
		}
	}
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err == nil &&
		(strings.Contains(string(b), "[always]") || strings.Contains(string(b), "[madvise]")) {
		want = HugePagesTry
	}
	if s.HugePages != want {
		t.Fatalf("detected %s, files say %s", s.HugePages, want)
	}
	t.Logf("this host: huge_pages=%s", s.HugePages)
}

func TestPlanErrors(t *testing.T) {
	p := host("0", noTHP)
	if _, err := p.Plan(1<<30, "arc", DefaultConfig()); err == nil {
		t.Error("unknown strategy accepted")
	}
	// 16 MiB budget at 75% cannot hold 16 MiB of shared_buffers + an LFC.
	if _, err := p.Plan(16<<20, StrategyLFC, DefaultConfig()); !errors.Is(err, ErrBudget) {
		t.Errorf("tiny lfc budget: %v", err)
	}
	// Below Postgres' 16 buffers.
	if _, err := p.Plan(100_000, StrategySharedBuffers, DefaultConfig()); !errors.Is(err, ErrBudget) {
		t.Errorf("tiny budget: %v", err)
	}
	if _, err := p.Plan(-1, StrategySharedBuffers, DefaultConfig()); !errors.Is(err, ErrBudget) {
		t.Errorf("negative budget: %v", err)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		mod  func(*Config)
		want string
	}{
		{func(c *Config) { c.Fraction = 0 }, "shared_buffers.fraction:"},
		{func(c *Config) { c.Fraction = 1.5 }, "shared_buffers.fraction:"},
		{func(c *Config) { c.MinBytes = 1000 }, "shared_buffers.min_bytes:"},
		{func(c *Config) { c.HugePages = "maybe" }, "shared_buffers.huge_pages:"},
	}
	for _, tc := range cases {
		c := DefaultConfig()
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", c, err, tc.want)
		}
	}
}

func TestNeedsRestart(t *testing.T) {
	p := host("0", noTHP)
	a, _ := p.Plan(1<<30, StrategyLFC, DefaultConfig())
	b, _ := p.Plan(2<<30, StrategyLFC, DefaultConfig())
	if NeedsRestart(a, b) {
		t.Error("an LFC-only change needs a restart")
	}
	c, _ := p.Plan(2<<30, StrategySharedBuffers, DefaultConfig())
	if !NeedsRestart(a, c) || !NeedsRestart(c, b) {
		t.Error("a shared_buffers change does not need a restart")
	}
	d := c
	d.HugePages = HugePagesTry
	if !NeedsRestart(c, d) {
		t.Error("a huge_pages change does not need a restart")
	}
}
