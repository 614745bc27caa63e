package pageserver

import (
	"errors"
	"testing"

	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"policy":     func(c *Config) { c.ImagePolicy = "magic" },
		"pushdown":   func(c *Config) { c.ImagePolicy = "pushdown"; c.PushdownDeltas = 0 },
		"bytes":      func(c *Config) { c.PushdownBytes = -1 },
		"hot":        func(c *Config) { c.ImagePolicy = "hot"; c.HotBurst = 0 },
		"dir":        func(c *Config) { c.DataDir = "" },
		"checkpoint": func(c *Config) { c.CheckpointDistance = 10 },
		"compaction": func(c *Config) { c.CompactionThreshold = 1 },
		"upload":     func(c *Config) { c.UploadParallelism = 0 },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := DefaultConfig()
	c.ImagePolicy = "pushdown"
	if p := c.Policy(); p.MaterializeAfter() != 16 || p.Name() != "pushdown" {
		t.Fatalf("policy %v", p.Name())
	}
	var _ timeline.ImagePolicy = c.Policy()
	c.ImagePolicy, c.PushdownDeltas, c.PushdownBytes, c.HotBurst = "hot", 3, 4096, 2
	hot, ok := c.Policy().(timeline.HotPolicy)
	if !ok || hot.Name() != "hot" || hot.N != 3 || hot.NBytes != 4096 || hot.Burst != 2 {
		t.Fatalf("hot policy %#v", c.Policy())
	}
}

func TestRelPath(t *testing.T) {
	for want, got := range map[string]string{
		"global/1262":                         RelPath(pg.RelTag{Spc: 1664, Rel: 1262}, 0),
		"base/5/16384_vm":                     RelPath(pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.VMFork}, 0),
		"base/5/16384.2":                      RelPath(pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}, 2),
		"pg_tblspc/9/PG_15_202209061/5/7_fsm": RelPath(pg.RelTag{Spc: 9, DB: 5, Rel: 7, Fork: pg.FSMFork}, 0),
	} {
		if want != got {
			t.Errorf("got %s want %s", got, want)
		}
	}
}
