package cluster

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/smallfs"
)

// TestPageserverDiskFull runs `strata up` with the pageserver's folder on a
// small tmpfs and a client-side ledger of single-row commits while a bulk
// load fills it. While it is full, acknowledged commits stay acknowledged
// (their WAL is on the safekeepers) however Postgres fares; once the
// tmpfs is grown, the cluster serves again without anyone restarting
// anything, every acknowledged row is there and pg_amcheck is clean.
func TestPageserverDiskFull(t *testing.T) {
	t.Parallel()
	c, cfg := newTestCluster(t)
	psDir := filepath.Join(cfg.Cluster.DataDir, "pageserver")
	smallfs.MountAt(t, psDir, 48<<20, "0755")
	// Cleanups run last registered first: stop the cluster before the
	// tmpfs goes.
	t.Cleanup(func() { c.Down(context.Background(), func(string) {}) })
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE ledger (id int PRIMARY KEY)")
	exec1(t, ctx, url, "CREATE TABLE filler (id int, pad text)")
	stop, done := make(chan struct{}), make(chan map[int]bool, 1)
	go ledger(ctx, url, 1, stop, done)

	// 400 MB of table pages in 20 MB statements, with checkpoints: far
	// more than the 48 MiB the pageserver has, about 24 MiB of it taken
	// once the cluster is up (full during the second statement or its
	// checkpoint; 64 MiB took a third, 4 CPU-s more).
	full := false
	for i := 0; i < 20 && !full; i++ {
		if err := tryExec(ctx, url, "INSERT INTO filler SELECT g, repeat('x', 900) FROM generate_series(1, 20000) g"); err != nil {
			t.Logf("bulk load %d: %v", i, err)
			full = true
		}
		// A checkpoint of 20 MB takes a few seconds; with the disk full
		// it waits for page writes the pageserver cannot take.
		if err := tryExecWithin(ctx, url, 20*time.Second, "CHECKPOINT"); err != nil {
			t.Logf("checkpoint after load %d: %v", i, err)
			full = true
		}
	}
	if !full {
		t.Fatal("400 MB went into a pageserver with 48 MiB of disk")
	}
	time.Sleep(3 * time.Second)
	close(stop)
	acked := <-done
	t.Logf("%d ledger commits acknowledged before and while the disk was full", len(acked))

	smallfs.Resize(t, psDir, 4<<30)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		err := tryExec(ctx, url, "CHECKPOINT")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster did not recover after space was freed: %v", err)
		}
		time.Sleep(2 * time.Second)
	}
	have := ledgerRows(t, ctx, url)
	for id := range acked {
		if !have[id] {
			t.Fatalf("acknowledged ledger row %d is missing (%d acknowledged, %d present)", id, len(acked), len(have))
		}
	}
	exec1(t, ctx, url, "INSERT INTO ledger VALUES (-1)")
	pgtool(t, url, "pg_amcheck", "--install-missing", "--heapallindexed", "-d", "postgres")
	t.Logf("recovered: %d acknowledged rows present, pg_amcheck clean", len(acked))
}

// tryExec runs one statement on a new connection.
func tryExec(ctx context.Context, url, sql string) error {
	return tryExecWithin(ctx, url, 60*time.Second, sql)
}

// tryExecWithin runs one statement on a new connection, for at most d.
func tryExecWithin(ctx context.Context, url string, d time.Duration, sql string) error {
	if err := waitConnect(ctx, url, 30*time.Second); err != nil {
		return err
	}
	return execWithin(ctx, url, d, sql)
}
