package cluster

import (
	"context"
	"os"
	"testing"
	"time"
)

// TestCrashRoundsRedo is TestCrashRounds in redo mode (STRATA_LONG_TESTS=1):
// storage.page_source redo with pushdown, full_page_writes off and a local
// page store of 1000 pages. Each restart starts with an empty local store,
// so every page comes back rebuilt from WAL by the pageserver.
func TestCrashRoundsRedo(t *testing.T) {
	if os.Getenv("STRATA_LONG_TESTS") != "1" {
		t.Skip("STRATA_LONG_TESTS=1 runs ten kill -9 rounds on the whole cluster in redo mode")
	}
	c, _ := newRedoCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	n := crashRounds(t, ctx, c, url, 11)
	t.Logf("10 rounds in redo mode, %d acknowledged rows, all present, pgbench balances agree, pg_amcheck clean", n)
}
