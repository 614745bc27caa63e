package cluster

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/walingest"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// TestRedoBasebackupFromWAL is acceptance 2 of the redo issue through the
// cluster: after a redo-mode cluster ran a workload and stopped, the
// pageserver's redo timeline (initdb's imported output plus what WAL
// ingest stored: no compute page write) gives a WAL-only basebackup
// (pageserver.BasebackupFromWAL, pg_control rebuilt from a checkpoint
// record); a stock Postgres started on an empty folder from it and the
// safekeepers' WAL serves the same data, pg_amcheck clean.
func TestRedoBasebackupFromWAL(t *testing.T) {
	t.Parallel()
	c, cfg := newRedoCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	url, err := c.Up(ctx, func(s string) { t.Log(s) })
	if err != nil {
		t.Fatal(err)
	}
	exec1(t, ctx, url, "CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec1(t, ctx, url, "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 3000) g")
	exec1(t, ctx, url, "DELETE FROM t WHERE id % 5 = 0")
	pgtool(t, url, "pgbench", "-i", "-q", "-s", "1")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "250")
	exec1(t, ctx, url, "CHECKPOINT")
	pgtool(t, url, "pgbench", "-n", "-c", "2", "-t", "150") // work after the last checkpoint
	want := queryString(t, ctx, url, redoCheckSQL)
	checkPgbench(t, want)
	st, err := c.readState()
	if err != nil {
		t.Fatal(err)
	}
	tlID, err := pg.ParseTimelineID(st.Timeline)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Down(ctx, func(string) {}); err != nil {
		t.Fatal(err)
	}

	// The safekeepers again, for their WAL; the pageserver's data folder
	// and object store opened in this process.
	replPW, err := c.secret("replication.password")
	if err != nil {
		t.Fatal(err)
	}
	for i, id := range c.safekeeperIDs() {
		p, err := c.startSafekeeper(i, id, replPW)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(30 * time.Second) })
	}
	var status server.Status
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		cl, err := server.Dial(c.safekeeperAddr(0))
		if err == nil {
			status, err = cl.Status(ctx)
			cl.Close()
		}
		// Just restarted, its commit LSN catches up with its flush LSN
		// (the WAL every safekeeper holds after a clean down) once it
		// hears from its peers.
		if err == nil && status.FlushLSN > 0 && status.CommitLSN >= status.FlushLSN {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("safekeeper sk1: %v, status %+v", err, status)
		}
	}
	store, err := fs.New(cfg.ObjectStore.FS, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	pcfg := pageserver.DefaultConfig()
	pcfg.DataDir = filepath.Join(c.dataDir, "pageserver")
	pcfg.ImagePolicy = cfg.Storage.ImagePolicy
	ps, err := pageserver.New(ctx, pcfg, pageserver.Deps{Log: zerolog.Nop(), Registry: prometheus.NewRegistry(), Store: store,
		Redo: walingest.Redo{Engine: postgres.NewEngine(postgres.Options{})}})
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	tl, err := ps.Timeline(tlID)
	if err != nil {
		t.Fatal(err)
	}
	lsn := tl.LSNs().LastRecord

	root := pgtest.MkdirOwned(t, "strata-redo-bb-")
	dataDir := filepath.Join(root, "data")
	if err := os.Mkdir(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Chown(dataDir); err != nil {
		t.Fatal(err)
	}
	uid, gid := 0, 0
	if cred, err := pgtest.Credential(); err != nil {
		t.Fatal(err)
	} else if cred != nil {
		uid, gid = int(cred.Uid), int(cred.Gid)
	}
	// Every WAL segment the safekeepers hold, up to their durable end:
	// the checkpoint is looked for in it, and Postgres replays from the
	// checkpoint's REDO point to the end.
	walDir := filepath.Join(dataDir, "pg_wal")
	n, err := agent.FillWAL(ctx, agent.WALSource{Safekeepers: c.safekeeperAddrs(), Archive: store, Prefix: "wal"}, walDir, status.Timeline, status.StartLSN, status.CommitLSN, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	src, err := wal.OpenDir(walDir)
	if err != nil {
		t.Fatal(err)
	}
	ckpt, err := pageserver.FindCheckpoint(src, status.StartLSN, lsn)
	src.Close()
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(pageserver.BasebackupFromWAL(ctx, tl, lsn, ckpt, time.Now(), pw)) }()
	pgtest.Untar(t, pr, dataDir)
	t.Logf("WAL-only basebackup of timeline %s at %s (checkpoint %s, REDO %s), %d WAL segments up to %s", tlID, lsn, ckpt.LSN, ckpt.Redo, n, status.CommitLSN)

	// initdb (in the agent) asked for passwords over TCP: trust, here.
	hba := filepath.Join(dataDir, "pg_hba.conf")
	if err := os.WriteFile(hba, []byte("local all all trust\nhost all all 127.0.0.1/32 trust\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Chown(hba); err != nil {
		t.Fatal(err)
	}
	srv := pgtest.StartOn(t, dataDir, root, 0)
	got := srv.Query(redoCheckSQL)
	if got != want {
		t.Fatalf("Postgres on the WAL-only basebackup: %s, want %s", got, want)
	}
	srv.Run("pg_amcheck", "--install-missing", "--all", "--heapallindexed")
	t.Logf("stock Postgres on the WAL-only basebackup: same data (%s), pg_amcheck clean", got)
}
