package walingest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/plugins/replication/pgstream"
	"github.com/stratadb/strata/sdk/pg"
)

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFollowLive follows a running Postgres 15 through a safekeeper that
// streams from it: the ingester runs while the workload writes (across a
// pg_switch_wal), and the
// table's size and pages (rebuilt from WAL by the redo engine) must match
// Postgres' own once the safekeeper has committed the WAL.
func TestFollowLive(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{Conf: map[string]string{"full_page_writes": "on", "autovacuum": "off", "synchronous_standby_names": "'sk1'"}})
	cfg := safekeeper.DefaultConfig()
	cfg.ID, cfg.DataDir, cfg.ListenAddr = "sk1", t.TempDir(), "127.0.0.1:0"
	cfg.Postgres = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", srv.Port)
	cfg.StatusInterval = 100 * time.Millisecond
	n, err := safekeeper.New(cfg, safekeeper.Deps{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Listen(); err != nil {
		t.Fatal(err)
	}
	skCtx, skCancel := context.WithCancel(context.Background())
	skDone := make(chan struct{})
	go func() { n.Run(skCtx); close(skDone) }()
	t.Cleanup(func() { skCancel(); <-skDone })
	src, err := pgstream.New(pgstream.Config{Safekeepers: []string{n.Addr()}}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { src.Close() })
	ctx := context.Background()
	var held pg.LSN
	waitFor(t, 30*time.Second, "the safekeeper's first WAL", func() bool {
		p, err := src.Positions(ctx)
		held = p.Start
		return err == nil && p.Commit > p.Start
	})
	// Start at a checkpoint record the safekeeper holds (the WAL before it
	// is initdb's, with a FILE_COPY CREATE DATABASE).
	srv.Exec("postgres", "CHECKPOINT")
	start := mustLSN(t, srv.QueryString("postgres", "SELECT checkpoint_lsn::text FROM pg_control_checkpoint()"))
	if start < held {
		t.Fatalf("checkpoint %s is before the safekeeper's first WAL %s", start, held)
	}

	tl, fb := newTimeline(t)
	in := &Ingester{TL: tl, Feedback: fb, BatchSize: 32}
	runCtx, stop := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() {
		_, err := in.RunStream(runCtx, src, "pageserver", start)
		runErr <- err
	}()

	srv.Exec("postgres", `CREATE TABLE live (id int, v text);
		INSERT INTO live SELECT g, repeat('v', 100) FROM generate_series(1, 3000) g`)
	// A WAL switch: the record after it starts the next segment, past
	// what the stream has sent (the pageserver panicked there).
	srv.QueryString("postgres", "SELECT pg_switch_wal()::text")
	srv.Exec("postgres", "UPDATE live SET v = 'changed' WHERE id % 5 = 0")
	srv.Exec("postgres", "CHECKPOINT")
	end := mustLSN(t, srv.QueryString("postgres", "SELECT pg_current_wal_flush_lsn()::text"))
	dbOID, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT oid::text FROM pg_database WHERE datname = 'postgres'"), 10, 32)
	node, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT relfilenode::text FROM pg_class WHERE relname = 'live'"), 10, 32)
	size, _ := strconv.ParseUint(srv.QueryString("postgres", "SELECT (pg_relation_size('live') / 8192)::text"), 10, 32)
	path := srv.QueryString("postgres", "SELECT pg_relation_filepath('live')")
	waitFor(t, 30*time.Second, "ingest to reach "+end.String(), func() bool {
		select {
		case err := <-runErr:
			t.Fatalf("ingest stopped: %v", err)
		default:
		}
		return tl.LSNs().LastRecord >= end
	})
	stop()
	if err := <-runErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("RunStream after cancel: %v", err)
	}
	srv.Stop()

	rel := pg.RelTag{Spc: 1663, DB: uint32(dbOID), Rel: uint32(node)}
	nb, ok, err := tl.Nblocks(ctx, rel, end)
	if err != nil || !ok || nb != uint32(size) || size < 10 {
		t.Fatalf("Nblocks = %d %v %v, Postgres has %d", nb, ok, err, size)
	}
	file, err := os.ReadFile(filepath.Join(srv.DataDir, path))
	if err != nil {
		t.Fatal(err)
	}
	for blk := uint32(0); blk < nb; blk++ {
		got, err := tl.GetPage(ctx, rel.Page(blk), end, end)
		if err != nil {
			t.Fatalf("GetPage block %d: %v", blk, err)
		}
		got = bytes.Clone(got)
		want := bytes.Clone(file[int(blk)*pg.BlockSize : int(blk+1)*pg.BlockSize])
		postgres.Mask(wal.RmHeap, got, blk)
		postgres.Mask(wal.RmHeap, want, blk)
		if !bytes.Equal(got, want) {
			t.Errorf("block %d differs from the data file after masking", blk)
		}
	}
	if fb.n == 0 || fb.last.LastRecord < end {
		t.Fatalf("feedback %d reports, last %s", fb.n, fb.last.LastRecord)
	}
	t.Logf("followed %s..%s live: %d pages compared", start, tl.LSNs().LastRecord, nb)
}
