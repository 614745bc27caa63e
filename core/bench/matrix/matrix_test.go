package matrix

import (
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/bench/target"
	"github.com/stratadb/strata/internal/doccheck"
)

func TestScheduleInterleaves(t *testing.T) {
	m, err := Parse([]byte(`
name: t
targets:
  - {name: a, kind: stock}
  - {name: b, kind: stock-sync}
settings:
  full_page_writes: [on, off]
  shared_buffers: 128MB
virtual_users: [1, 4]
warehouses: 2
duration: 10s
repeats: 3
baseline: b
`))
	if err != nil {
		t.Fatal(err)
	}
	cs := m.Configs()
	if len(cs) != 2*2*2 {
		t.Fatalf("%d configs", len(cs))
	}
	if cs[0].Label() != "a full_page_writes=on shared_buffers=128MB wh=2 vus=1" {
		t.Fatalf("label %q", cs[0].Label())
	}
	if cs[0].Duration != 10*time.Second || cs[0].Rampup != 10*time.Second || cs[0].Warehouses != 2 {
		t.Fatalf("config %+v", cs[0])
	}
	s := m.Schedule()
	if len(s) != 24 {
		t.Fatalf("%d runs", len(s))
	}
	// Interleaved: every configuration once before any repeats.
	for i, r := range s {
		if r.Repeat != i/8+1 || r.Label() != cs[i%8].Label() {
			t.Fatalf("run %d = repeat %d %s", i, r.Repeat, r.Label())
		}
	}
	if m.P95() != 20*time.Millisecond || !m.VerifyEnabled() {
		t.Fatal("defaults")
	}
	if m.Baseline != "b" {
		t.Fatalf("baseline %q, want b", m.Baseline)
	}
}

func TestInvalid(t *testing.T) {
	for _, y := range []string{
		`targets: [{kind: stock}]`,
		`name: x`,
		"name: x\ntargets: [{kind: stock}]\nvirtual_users: [0]",
		"name: x\ntargets: [{kind: stock}]\nduration: soon",
		"name: x\ntargets: [{kind: stock}]\nsettle: soon",
		"name: x\ntargets: [{kind: stock}]\nunknown_key: 1",
		"name: x\nworkload: ycsb\ntargets: [{kind: stock}]",
		"name: x\ntargets: [{kind: stock, config: {storage.image_policy: fpi}}]",
		"name: x\ntargets: [{kind: strata, profile: p.yaml, config: {\"\": x}}]",
		"name: x\ntargets: [{kind: stock}, {kind: stock-sync}]\nbaseline: stock-sync-2",
	} {
		if _, err := Parse([]byte(y)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: err = %v", y, err)
		}
	}
}

// TestShippedConfigs parses every matrix in configs/bench.
func TestShippedConfigs(t *testing.T) {
	files, _ := filepath.Glob("../../../configs/bench/*.yaml")
	if len(files) == 0 {
		t.Skip("no configs/bench/*.yaml")
	}
	for _, f := range files {
		m, err := Load(f)
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		// A strata target's profile and config keys load as strata up
		// will load them (profiles are relative to the repository root).
		for _, tc := range m.Targets {
			if tc.Kind != "strata" {
				continue
			}
			tc.Profile = filepath.Join("../../..", tc.Profile)
			if _, err := target.NewStrata(tc, zerolog.Nop()); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
	}
}

// TestDocsMatrix: the matrix example of docs/benchmarks.md (every key
// the file format has, with comments) parses, and so do its commented
// target examples once uncommented (core/config's TestDocsConfigKeys
// leaves matrices to this test).
func TestDocsMatrix(t *testing.T) {
	blocks, err := doccheck.Blocks("../../..", []string{"docs/benchmarks.md"}, "yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, blk := range blocks {
		text := blk.Text
		if !strings.Contains(text, "\nworkload:") {
			continue
		}
		n++
		if _, err := Parse([]byte(text)); err != nil {
			t.Errorf("the example matrix: %v", err)
		}
		// The commented targets ("  # - {...}" and "  # - name: ...", with
		// their "  #   key: ..." lines) uncommented, prose lines dropped.
		var lines []string
		for _, l := range strings.Split(text, "\n") {
			switch {
			case strings.HasPrefix(l, "  # - "):
				lines = append(lines, "  - "+strings.TrimPrefix(l, "  # - "))
			case regexp.MustCompile(`^  #   (kind|profile|config|url|receivers|quorum): `).MatchString(l):
				lines = append(lines, "    "+strings.TrimPrefix(l, "  #   "))
			case strings.HasPrefix(l, "  #"):
			default:
				lines = append(lines, l)
			}
		}
		m, err := Parse([]byte(strings.Join(lines, "\n")))
		if err != nil {
			t.Errorf("the example matrix with its commented targets: %v", err)
			continue
		}
		if len(m.Targets) < 5 {
			t.Errorf("the example matrix with its commented targets has %d targets, want 5", len(m.Targets))
		}
	}
	if n == 0 {
		t.Fatal("no matrix example in docs/benchmarks.md")
	}
}
