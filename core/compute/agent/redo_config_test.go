package agent

import (
	"errors"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

// TestRedoConfig: page source redo needs a distinct files timeline and a
// pageserver that follows the safekeepers, refuses wal_log_hints off,
// forces it on otherwise, and sizes the local page store.
func TestRedoConfig(t *testing.T) {
	base := func() Config {
		return Config{Pageserver: "127.0.0.1:1", Timeline: pg.TimelineID{1}, Safekeepers: []string{"a", "b", "c"},
			Mountpoint: t.TempDir(), Scratch: t.TempDir(), Port: 5432, PageSource: PageSourceRedo, FilesTimeline: pg.TimelineID{2}}
	}
	for name, mod := range map[string]func(*Config){
		"no files timeline":   func(c *Config) { c.FilesTimeline = pg.TimelineID{} },
		"same timeline":       func(c *Config) { c.FilesTimeline = c.Timeline },
		"feed commit":         func(c *Config) { c.FeedCommit = true },
		"wal_log_hints off":   func(c *Config) { c.Settings = map[string]string{"wal_log_hints": "'off'"} },
		"negative store size": func(c *Config) { c.RedoStorePages = -1 },
		"unknown page source": func(c *Config) { c.PageSource = "mirror" },
	} {
		c := base()
		mod(&c)
		if err := c.defaults(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	c := base()
	c.Settings = map[string]string{"wal_log_hints": "true", "work_mem": "'8MB'"}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	if c.RedoStorePages != 16384 || c.filesTimeline() != c.FilesTimeline {
		t.Fatalf("defaults: store %d pages, files timeline %s", c.RedoStorePages, c.filesTimeline())
	}
	s := (&Agent{cfg: c}).settings([]string{"sk1", "sk2", "sk3"})
	if s["wal_log_hints"] != "on" || s["work_mem"] != "'8MB'" {
		t.Fatalf("settings: wal_log_hints %q, work_mem %q", s["wal_log_hints"], s["work_mem"])
	}
	wb := base()
	wb.PageSource, wb.FilesTimeline = "", pg.TimelineID{}
	if err := wb.defaults(); err != nil || wb.PageSource != PageSourceWriteback || wb.filesTimeline() != wb.Timeline {
		t.Fatalf("writeback defaults: %v, %q", err, wb.PageSource)
	}
	if s := (&Agent{cfg: wb}).settings(nil); s["wal_log_hints"] != "" {
		t.Fatalf("writeback mode sets wal_log_hints %q", s["wal_log_hints"])
	}
}

// TestSettingsCommitDelay: strata's Postgres groups commits by default
// (commit_delay, see settings) and makes no prefetch calls (its
// posix_fadvise reads each block twice through the mount), and
// compute.settings replaces the values.
func TestSettingsCommitDelay(t *testing.T) {
	c := Config{Pageserver: "127.0.0.1:1", Timeline: pg.TimelineID{1}, Safekeepers: []string{"a", "b", "c"},
		Mountpoint: t.TempDir(), Scratch: t.TempDir(), Port: 5432}
	if err := c.defaults(); err != nil {
		t.Fatal(err)
	}
	if s := (&Agent{cfg: c}).settings([]string{"sk1"}); s["commit_delay"] != "200" {
		t.Fatalf("default commit_delay %q, want 200", s["commit_delay"])
	}
	if s := (&Agent{cfg: c}).settings([]string{"sk1"}); s["effective_io_concurrency"] != "0" || s["maintenance_io_concurrency"] != "0" {
		t.Fatalf("default effective_io_concurrency %q, maintenance_io_concurrency %q, want 0 and 0", s["effective_io_concurrency"], s["maintenance_io_concurrency"])
	}
	c.Settings = map[string]string{"commit_delay": "0", "maintenance_io_concurrency": "10"}
	if s := (&Agent{cfg: c}).settings([]string{"sk1"}); s["commit_delay"] != "0" || s["maintenance_io_concurrency"] != "10" {
		t.Fatalf("commit_delay with compute.settings 0: %q; maintenance_io_concurrency with 10: %q", s["commit_delay"], s["maintenance_io_concurrency"])
	}
}
