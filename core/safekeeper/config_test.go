package safekeeper

import (
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	if c.SlotName() != "strata_sk1" {
		t.Fatalf("slot %q", c.SlotName())
	}
	for _, mut := range []func(*Config){
		func(c *Config) { c.ID = "SK-1" },
		func(c *Config) { c.DataDir = "" },
		func(c *Config) { c.StatusInterval = 0 },
		func(c *Config) { c.Slot = "bad slot" },
		func(c *Config) { c.Archive.Enabled, c.Archive.Interval = true, 0 },
		func(c *Config) { c.Archive.ConsumerExpiry = -time.Second },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("invalid config accepted: %+v", c)
		}
	}
}

func TestWithHostPort(t *testing.T) {
	got := withHostPort("postgres://u:p@10.0.0.1:5432/postgres?sslmode=disable", "127.0.0.1:6000")
	if got != "postgres://u:p@127.0.0.1:6000/postgres?sslmode=disable" {
		t.Fatalf("url: %s", got)
	}
	if got := withHostPort("user=u password=p host=a port=1", "b:2"); got != "user=u password=p host=a port=1 host=b port=2" {
		t.Fatalf("dsn: %s", got)
	}
	if got := withHostPort("postgres://x@h:1/db", ""); got != "postgres://x@h:1/db" {
		t.Fatalf("empty: %s", got)
	}
}
