package cluster

import (
	"slices"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
)

// TestSafekeeperArgs: strata up passes cluster.safekeeper_gomaxprocs to
// each safekeeper (default 1), and nothing for 0 (Go's default); and
// --raw-syscalls=false only when cluster.safekeeper_raw_syscalls is false
// (the safekeeper's own default is true); and cluster.safekeeper_wal_retain
// as --archive-retain in writeback mode.
func TestSafekeeperArgs(t *testing.T) {
	cfg := config.Default()
	cfg.Cluster.DataDir = t.TempDir()
	c, err := New(&cfg, "strata", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	args := c.safekeeperArgs(1, "sk2", "/x/sk2")
	i := slices.Index(args, "--gomaxprocs")
	if i < 0 || i+1 >= len(args) || args[i+1] != "1" {
		t.Errorf("default: %s; want --gomaxprocs 1", strings.Join(args, " "))
	}
	if !slices.Contains(args, "sk2") || !strings.Contains(strings.Join(args, " "), "--peers 127.0.0.1:7676,127.0.0.1:7678") {
		t.Errorf("default: %s; want sk2 with sk1 and sk3 as peers", strings.Join(args, " "))
	}
	cfg.Cluster.SafekeeperGOMAXPROCS = 0
	if args := c.safekeeperArgs(0, "sk1", "/x/sk1"); slices.Contains(args, "--gomaxprocs") {
		t.Errorf("safekeeper_gomaxprocs 0: %s; want no --gomaxprocs", strings.Join(args, " "))
	}
	if slices.Contains(args, "--raw-syscalls=false") {
		t.Errorf("default: %s; want no --raw-syscalls=false", strings.Join(args, " "))
	}
	cfg.Cluster.SafekeeperRawSyscalls = false
	if args := c.safekeeperArgs(0, "sk1", "/x/sk1"); !slices.Contains(args, "--raw-syscalls=false") {
		t.Errorf("safekeeper_raw_syscalls false: %s; want --raw-syscalls=false", strings.Join(args, " "))
	}
	// cluster.safekeeper_wal_retain in writeback mode (the default), in
	// bytes; 0 and redo mode pass nothing (the safekeeper's 0: keep it
	// until a consumer reports).
	retain := func() string {
		args := c.safekeeperArgs(0, "sk1", "/x/sk1")
		if i := slices.Index(args, "--archive-retain"); i >= 0 && i+1 < len(args) {
			return args[i+1]
		}
		return ""
	}
	for _, tc := range []struct{ retain, policy, want string }{
		{"1GiB", "writeback", "1073741824"},
		{"256MB", "writeback", "268435456"},
		{"0", "writeback", ""},
		{"1GiB", "pushdown", ""},
	} {
		cfg.Cluster.SafekeeperWALRetain, cfg.Storage.ImagePolicy = tc.retain, tc.policy
		if got := retain(); got != tc.want {
			t.Errorf("safekeeper_wal_retain %s, image policy %s: --archive-retain %q, want %q", tc.retain, tc.policy, got, tc.want)
		}
	}
}
