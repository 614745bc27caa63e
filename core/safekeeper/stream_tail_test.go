package safekeeper

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/stream"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestStreamStaleTail: a safekeeper whose local WAL runs past what
// Postgres has (a tail Postgres will write differently, as after a crash)
// never reports that tail to Postgres as flushed, and replaces it with
// Postgres' WAL once Postgres writes there. Reporting it would acknowledge
// Postgres' next commits before the safekeeper holds them.
func TestStreamStaleTail(t *testing.T) {
	srv := testpg.Start(t, testpg.Options{})
	st, err := walstore.Open(walstore.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := stream.Config{ConnString: testpg.ReplConnString(srv), AppName: "skt", Slot: "strata_skt", StatusInterval: 100 * time.Millisecond, Logger: testLogger(t)}
	run := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- stream.Run(ctx, cfg, st, nil) }()
		return func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("stream: %v", err)
			}
		}
	}
	// Receive what Postgres has.
	srv.Exec("postgres", "BEGIN; SET LOCAL synchronous_commit = local; CREATE TABLE t (x int); COMMIT")
	stop := run()
	end := testpg.FlushLSN(t, srv)
	testpg.WaitFor(t, 30*time.Second, "the safekeeper to catch up", func() bool { return st.FlushLSN() >= end })
	stop()

	// A stale tail: 3,000 bytes Postgres never wrote.
	held := st.WriteLSN()
	if err := st.Write(held, bytes.Repeat([]byte{0xAB}, 3000)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Flush(); err != nil {
		t.Fatal(err)
	}
	stale := st.FlushLSN()
	pgFlush := testpg.FlushLSN(t, srv)
	if stale <= pgFlush {
		t.Fatalf("setup: store flush %s is not past Postgres' %s", stale, pgFlush)
	}
	stop = run()
	defer stop()
	reported := func() pg.LSN {
		s := srv.QueryString("postgres", "SELECT coalesce(max(flush_lsn), '0/0')::text FROM pg_stat_replication WHERE application_name = 'skt'")
		l, err := pg.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	// Reconnected and reporting, Postgres idle: the report stays at or
	// below Postgres' own flush.
	testpg.WaitFor(t, 30*time.Second, "a status report", func() bool { return reported() > 0 })
	for i := 0; i < 10; i++ {
		if r, f := reported(), testpg.FlushLSN(t, srv); r > f {
			t.Fatalf("the safekeeper reported flush %s, past Postgres' flush %s (its stale tail ends at %s)", r, f, stale)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Postgres writes over the tail: the safekeeper keeps Postgres' bytes.
	for i := 0; i < 20; i++ {
		srv.Exec("postgres", "BEGIN; SET LOCAL synchronous_commit = local; INSERT INTO t SELECT generate_series(1, 100); COMMIT")
	}
	end = testpg.FlushLSN(t, srv)
	testpg.WaitFor(t, 30*time.Second, "the safekeeper to catch up again", func() bool { return st.FlushLSN() >= end })
	data, err := st.Read(held, int(end-held))
	if err != nil {
		t.Fatal(err)
	}
	testpg.CompareBytes(t, srv, held, data, "the safekeeper's WAL over the old tail")
}

// TestStreamSlotWithoutRestartLSN: a replication slot that exists without
// a restart LSN (Postgres crashed between writing the new slot's state
// file and reserving its WAL; on strata, the compute was killed before
// the second write reached the pageserver) is created again, and the
// safekeeper streams, with an empty store and with a store that holds
// WAL. Before, every connection failed with "slot has no restart LSN" and
// the safekeeper never streamed from that Postgres again.
func TestStreamSlotWithoutRestartLSN(t *testing.T) {
	srv := testpg.Start(t, testpg.Options{})
	st, err := walstore.Open(walstore.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := stream.Config{ConnString: testpg.ReplConnString(srv), AppName: "skn", Slot: "strata_skn", StatusInterval: 100 * time.Millisecond, Logger: testLogger(t)}
	unreserved := func() {
		srv.Exec("postgres", "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = 'strata_skn'")
		srv.Exec("postgres", "SELECT pg_create_physical_replication_slot('strata_skn', false)")
		if r := srv.QueryString("postgres", "SELECT coalesce(restart_lsn::text, 'none') FROM pg_replication_slots WHERE slot_name = 'strata_skn'"); r != "none" {
			t.Fatalf("setup: the slot's restart LSN is %s, want none", r)
		}
	}
	for _, round := range []string{"an empty store", "a store that holds WAL"} {
		unreserved()
		srv.Exec("postgres", "BEGIN; SET LOCAL synchronous_commit = local; CREATE TABLE IF NOT EXISTS t (x int); INSERT INTO t SELECT generate_series(1, 1000); COMMIT")
		end := testpg.FlushLSN(t, srv)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- stream.Run(ctx, cfg, st, nil) }()
		deadline := time.Now().Add(30 * time.Second)
		for st.FlushLSN() < end {
			select {
			case err := <-done:
				cancel()
				t.Fatalf("%s: the stream ended: %v", round, err)
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("%s: the store reached %s, not %s, in 30 s", round, st.FlushLSN(), end)
			}
		}
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: %v", round, err)
		}
		if r := srv.QueryString("postgres", "SELECT coalesce(restart_lsn::text, 'none') FROM pg_replication_slots WHERE slot_name = 'strata_skn'"); r == "none" {
			t.Fatalf("%s: the slot still has no restart LSN", round)
		}
		data, err := st.Read(end-100, 100)
		if err != nil {
			t.Fatal(err)
		}
		testpg.CompareBytes(t, srv, end-100, data, round+": the safekeeper's WAL")
	}
}
