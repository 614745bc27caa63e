package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/objectstore"
)

const checkSQL = `SELECT (SELECT count(*) FROM pgbench_accounts)::text || ' ' ||
	(SELECT sum(abalance) FROM pgbench_accounts)::text || ' ' ||
	(SELECT sum(bbalance) FROM pgbench_branches)::text || ' ' ||
	(SELECT coalesce(sum(delta),0) FROM pgbench_history)::text || ' ' ||
	(SELECT count(*) FROM pgbench_history)::text`

func waitPG(t *testing.T, p *pgProc) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if r, err := p.psql("SELECT 1"); err == nil && r == "1" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres did not accept connections\n%s", p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *pgProc) mustPsql(sql string) string {
	p.t.Helper()
	out, err := p.psql(sql)
	if err != nil {
		p.t.Fatalf("%s: %v\n%s\n%s", sql, err, out, p.tail())
	}
	return out
}

func (p *pgProc) pgbench(args ...string) string {
	p.t.Helper()
	cmd, err := pgtest.Command("pgbench", append([]string{"-h", "127.0.0.1", "-p", fmt.Sprint(p.port), "-U", "postgres"}, args...)...)
	if err != nil {
		p.t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		p.t.Fatalf("pgbench %v: %v\n%s\n%s", args, err, out, p.tail())
	}
	return string(out)
}

// walTicker commits a small transaction every few milliseconds until
// stopped, so that WAL keeps moving while a checkpoint's fsyncs wait for
// the commit LSN. It stands in for load: the compute's W of a page write is
// the end of the last WAL *page* Postgres wrote (zero-padded past the last
// record) while the safekeepers' commit LSN stops at the last record, so on
// an idle Postgres an fsync can wait until more WAL comes (until
// core/compute/walpos reports exact record ends).
func walTicker(t *testing.T, p *pgProc) func() {
	t.Helper()
	p.mustPsql("CREATE TABLE IF NOT EXISTS e2e_ticker (v text)")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			_, _ = p.psql("INSERT INTO e2e_ticker SELECT repeat('x', 2000)")
		}
	}()
	return func() { close(stop); wg.Wait() }
}

// TestWritebackFUSE covers acceptance item 1 in writeback mode: Postgres
// runs on a FUSE PGDATA (core/compute/fusefs over core/compute/psbackend)
// whose page writes go to the pageserver service, while three real
// safekeepers stream its WAL with synchronous_standby_names = ANY 2; the
// pageserver's durability gate takes its commit LSN from those
// safekeepers (sklink), not from the test. After pgbench, a checkpoint and
// a clean stop, every page of the pgbench relations that the compute reads
// through the mount equals GetPage at the latest LSN (masked), nothing is
// left pending, and a stock Postgres started on the pageserver's
// basebackup (local disk) has the same data and a clean pg_amcheck.
func TestWritebackFUSE(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	pgPort := pgtest.FreePort(t)
	nodes := startSafekeeperNodes(t, pgPort)
	var sks []string
	for _, n := range nodes {
		sks = append(sks, n.addr)
	}
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.ImagePolicy = "writeback"
	cfg.CheckpointDistance = 4 << 20
	cfg.LayerTargetSize = 2 << 20
	h := startPageserver(t, cfg, objectstore.NewMemory(), sks)
	if _, err := h.c.CreateTimeline(ctx, tlID); err != nil {
		t.Fatal(err)
	}
	root := pgtest.MkdirOwned(t, "strata-e2e-wb-")
	mnt, scratch := filepath.Join(root, "data"), filepath.Join(root, "walscratch")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Chown(mnt); err != nil {
		t.Fatal(err)
	}
	var uid, gid uint32
	if cred, err := pgtest.Credential(); err != nil {
		t.Fatal(err)
	} else if cred != nil {
		uid, gid = cred.Uid, cred.Gid
	}
	be, err := psbackend.Open(ctx, h.c, tlID, psbackend.Options{SyncTimeout: 2 * time.Minute, Log: testLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	// Send-only fsyncs until Postgres accepts connections: its startup
	// fsyncs pg_control before the safekeepers can connect (see
	// fusefs.FS.SetSyncDurable), as the compute agent does.
	fsys, err := fusefs.Mount(ctx, mnt, fusefs.Options{Backend: be, Cache: fusefs.NewMemCache(4096), WALScratch: scratch,
		UID: uid, GID: gid, Log: testLog(t), SendOnlySync: true})
	if err != nil {
		t.Fatal(err)
	}
	var unmountOnce sync.Once
	unmount := func() {
		unmountOnce.Do(func() {
			if err := fsys.Unmount(); err != nil {
				t.Errorf("unmount: %v", err)
			}
			fusefs.MountpointCleanup(mnt)
			if err := be.Close(); err != nil {
				t.Errorf("close backend: %v", err)
			}
		})
	}
	t.Cleanup(unmount)

	// initdb's backends run with fsync off; --no-sync skips its final
	// sync: nothing waits for the safekeepers, which only start streaming
	// once Postgres runs.
	cmd, err := pgtest.Command("initdb", "-D", mnt, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", "-A", "trust", "--no-sync")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	// Replication slots (the safekeepers' physical slots) are this
	// compute's own state, and Postgres renames their folders, which the
	// mount refuses (EXDEV); their fsyncs would also wait for the
	// safekeepers that are just connecting. Until core/compute keeps
	// pg_replslot local, the test bind-mounts a local folder there.
	slots := filepath.Join(root, "replslot")
	if err := os.Mkdir(slots, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Chown(slots); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", slots, filepath.Join(mnt, "pg_replslot")).CombinedOutput(); err != nil {
		t.Skipf("bind mount of pg_replslot: %v %s", err, out)
	}
	var slotsOnce sync.Once
	unmountSlots := func() {
		slotsOnce.Do(func() {
			if out, err := exec.Command("umount", filepath.Join(mnt, "pg_replslot")).CombinedOutput(); err != nil {
				t.Errorf("umount pg_replslot: %v %s", err, out)
			}
		})
	}
	t.Cleanup(unmountSlots)
	conf := "shared_buffers = 16MB\nfsync = on\nfull_page_writes = off\nautovacuum = off\nlog_min_messages = warning\n" +
		"synchronous_standby_names = " + syncConf + "\nwal_sender_timeout = '10s'\nmax_wal_size = '1GB'\ncheckpoint_timeout = '30min'\n"
	f, err := os.OpenFile(filepath.Join(mnt, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(conf); err != nil {
		t.Fatal(err)
	}
	f.Close()

	p := startPGOn(t, mnt, root, pgPort)
	waitPG(t, p)
	fsys.SetSyncDurable(true)
	// 600 transactions by default (5 s made about 1,100 under the default
	// run's load), 60 s with STRATA_LONG_TESTS=1.
	scale, run := "1", []string{"-t", "150"}
	if longTests() {
		scale, run = "5", []string{"-T", "60"}
	}
	p.pgbench("-i", "-s", scale, "postgres")
	out := p.pgbench(append(append([]string{"-c", "4", "-j", "2"}, run...), "postgres")...)
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "tps") {
			t.Logf("pgbench on FUSE, writeback, sync ANY 2 of 3 safekeepers: %s", l)
		}
	}
	rels := make([]relFile, 0, 8)
	for _, n := range []string{"pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "pgbench_accounts_pkey", "pgbench_branches_pkey", "pgbench_tellers_pkey"} {
		row := p.mustPsql("SELECT pg_relation_filepath(oid) || ' ' || relkind::text FROM pg_class WHERE relname = '" + n + "'")
		rels = append(rels, parseRelRow(t, n, row))
	}
	stopTicker := walTicker(t, p)
	t0 := time.Now()
	p.mustPsql("CHECKPOINT")
	t.Logf("CHECKPOINT on the mount: %v", time.Since(t0).Round(time.Millisecond))
	before := p.mustPsql(checkSQL)
	stopTicker()
	// As the compute agent does before it stops Postgres: W is the end of
	// the WAL Postgres wrote, and the WAL writer may have written some it
	// did not flush; the shutdown stops the WAL writer, and nothing
	// flushes that WAL before the shutdown checkpoint's fsyncs, so a
	// durable fsync would wait for WAL the safekeepers never get (seen:
	// Postgres' stop hung 60 s, the safekeepers' flush 488 bytes short of
	// W). The wait below for no pending versions is the durability check.
	fsys.SetSyncDurable(false)
	p.stop()

	w := fsys.WAL().Current()
	waits := fsys.Waits()
	nf := waits.Count(fusefs.OpFsync, relpath.KindRel) + waits.Count(fusefs.OpFsync, relpath.KindOther)
	tf := waits.Total(fusefs.OpFsync, relpath.KindRel) + waits.Total(fusefs.OpFsync, relpath.KindOther)
	if nf > 0 {
		t.Logf("fsyncs through the mount: %d, total wait %v, mean %v (the wait is the commit LSN from the safekeepers reaching W)", nf, tf.Round(time.Millisecond), (tf / time.Duration(nf)).Round(time.Microsecond))
	}
	var info []client.TimelineInfo
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err = h.c.ListTimelines(ctx)
		if err == nil && len(info) == 1 && info[0].LSNs.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pending versions not released 60 s after Postgres stopped: compute W %s; pageserver %+v, %v; safekeepers %s", w, info, err, skReport(nodes))
		}
	}
	t.Logf("compute W %s; pageserver %+v", w, info[0].LSNs)

	// The compute's view (read through the mount) equals the pageserver's.
	dataCopy := t.TempDir()
	for _, r := range rels {
		b, err := os.ReadFile(filepath.Join(mnt, r.path))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dataCopy, r.path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dataCopy, r.path), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	unmountSlots()
	unmount()
	n := comparePages(t, h.c, tlID, dataCopy, rels, client.LatestLSN, 1)
	t.Logf("writeback: %d pages from GetPage equal the compute's data files (masked)", n)
	if t.Failed() {
		t.FailNow()
	}

	// A stock Postgres on local disk from the pageserver's basebackup.
	var tarBuf bytes.Buffer
	if err := h.c.Basebackup(ctx, tlID, client.LatestLSN, &tarBuf); err != nil {
		t.Fatal(err)
	}
	root2 := pgtest.MkdirOwned(t, "strata-e2e-wb-bb-")
	bdir := filepath.Join(root2, "data")
	if err := os.Mkdir(bdir, 0o700); err != nil {
		t.Fatal(err)
	}
	untar(t, &tarBuf, bdir)
	if err := os.MkdirAll(filepath.Join(bdir, "pg_wal", "archive_status"), 0o700); err != nil {
		t.Fatal(err)
	}
	// Postgres stopped cleanly: its last checkpoint is the shutdown one,
	// and the WAL from there on is that record's segment.
	ckpt := controlCheckpoint(t, bdir)
	fetchWAL(t, sks[0], bdir, ckpt)
	chownTree(t, bdir)
	p2 := startPGOn(t, bdir, root2, pgtest.FreePort(t), "synchronous_standby_names=")
	waitPG(t, p2)
	if after := p2.mustPsql(checkSQL); after != before {
		t.Fatalf("stock Postgres on the basebackup: %s; the compute had %s", after, before)
	}
	if out, err := runAmcheck(p2); err != nil {
		t.Fatalf("pg_amcheck on the basebackup: %v\n%s", err, out)
	}
	t.Logf("stock Postgres on the basebackup: %s, pg_amcheck clean", before)
}

func runAmcheck(p *pgProc) (string, error) {
	cmd, err := pgtest.Command("pg_amcheck", "-h", "127.0.0.1", "-p", fmt.Sprint(p.port), "-U", "postgres", "--install-missing", "--all", "--heapallindexed")
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
