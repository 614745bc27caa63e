package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/service"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

var (
	psprocOnce sync.Once
	psprocPath string
	psprocErr  error
)

// psprocBinary builds ./internal/psproc once per test run.
func psprocBinary(t *testing.T) string {
	t.Helper()
	psprocOnce.Do(func() {
		dir, err := os.MkdirTemp("", "strata-psproc-")
		if err != nil {
			psprocErr = err
			return
		}
		psprocPath = filepath.Join(dir, "psproc")
		out, err := exec.Command("go", "build", "-o", psprocPath, "./internal/psproc").CombinedOutput()
		if err != nil {
			psprocErr = fmt.Errorf("go build psproc: %v\n%s", err, out)
		}
	})
	if psprocErr != nil {
		t.Fatal(psprocErr)
	}
	return psprocPath
}

// proc is a pageserver process (psproc) this test started.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string
	inc  uint64
	c    *client.Client
	done chan struct{}
	log  string
}

func startProc(t *testing.T, logName string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(psprocBinary(t), args...)
	logPath := filepath.Join(t.TempDir(), logName)
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer lf.Close()
	cmd.Stderr = lf
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, done: make(chan struct{}), log: logPath}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "READY ") {
				ready <- sc.Text()
			}
		}
	}()
	go func() { cmd.Wait(); close(p.done) }()
	t.Cleanup(p.kill9)
	// A failed test shows what the process logged (its folder goes with
	// the test).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s, last lines:\n%s", logName, p.tail())
		}
	})
	select {
	case line := <-ready:
		f := strings.Fields(line)
		p.addr = f[1]
		p.inc, _ = strconv.ParseUint(f[2], 10, 64)
	case <-p.done:
		t.Fatalf("pageserver process exited before it was ready\n%s", p.tail())
	case <-time.After(2 * time.Minute):
		t.Fatalf("pageserver process not ready\n%s", p.tail())
	}
	if p.c, err = client.Dial(p.addr); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// kill9 kills exactly this process with SIGKILL and waits for it.
func (p *proc) kill9() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Kill()
	}
	<-p.done
	if p.c != nil {
		p.c.Close()
		p.c = nil
	}
}

func (p *proc) info(t *testing.T) client.TimelineInfo {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	infos, err := p.c.ListTimelines(ctx)
	if err != nil {
		t.Fatalf("ListTimelines: %v\n%s", err, p.tail())
	}
	for _, i := range infos {
		if i.ID == tlID {
			return i
		}
	}
	t.Fatalf("timeline %s missing: %+v", tlID, infos)
	return client.TimelineInfo{}
}

// faultsFired reads the number of injected faults a psproc logged when
// its fault window ended, and fails if there were none.
func faultsFired(t *testing.T, p *proc) int {
	t.Helper()
	b, _ := os.ReadFile(p.log)
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.Contains(line, "object store faults off") {
			continue
		}
		var v struct {
			Fired int `json:"fired"`
		}
		if err := json.Unmarshal([]byte(line), &v); err == nil && v.Fired > 0 {
			return v.Fired
		}
	}
	t.Fatalf("no object store fault was injected\n%s", p.tail())
	return 0
}

// snapshot is a set of pages read at one durable LSN.
type snapshot struct {
	lsn   pg.LSN
	pages map[pg.PageKey][]byte // nil: did not exist
}

func readSnapshot(ctx context.Context, c *client.Client, lsn pg.LSN, keys []pg.PageKey) (snapshot, error) {
	s := snapshot{lsn: lsn, pages: map[pg.PageKey][]byte{}}
	reqs := make([]client.PageRequest, len(keys))
	for i, k := range keys {
		reqs[i] = client.PageRequest{Page: k, RequestLSN: lsn}
	}
	res, err := c.GetPages(ctx, tlID, reqs)
	if err != nil {
		return s, err
	}
	for i, r := range res {
		switch {
		case errors.Is(r.Err, timeline.ErrNotFound):
			s.pages[keys[i]] = nil
		case r.Err != nil:
			return s, fmt.Errorf("%s at %s: %w", keys[i], lsn, r.Err)
		default:
			s.pages[keys[i]] = bytes.Clone(r.Data)
		}
	}
	return s, nil
}

func checkSnapshots(t *testing.T, name string, c *client.Client, snaps []snapshot, upto pg.LSN) int {
	t.Helper()
	ctx := context.Background()
	n := 0
	for _, s := range snaps {
		if s.lsn > upto {
			continue
		}
		keys := make([]pg.PageKey, 0, len(s.pages))
		for k := range s.pages {
			keys = append(keys, k)
		}
		got, err := readSnapshot(ctx, c, s.lsn, keys)
		if err != nil {
			t.Fatalf("%s: reading at %s: %v", name, s.lsn, err)
		}
		for k, want := range s.pages {
			if g := got.pages[k]; !bytes.Equal(g, want) || (g == nil) != (want == nil) {
				t.Errorf("%s: %s at durable LSN %s differs from what was served before", name, k, s.lsn)
			}
			n++
		}
	}
	return n
}

// TestKillPageserverDuringIngest covers acceptance items 4 and 2 of issue
// 5: a pageserver process (the service bound to three real safekeepers,
// fpi policy, small layers so it flushes and uploads all the time) over an
// fs object store that injects transient and permanent errors, broken
// uploads and 20 ms latency for the first seconds of each run, is killed
// with SIGKILL while pgbench runs and its WAL is being ingested, and
// restarted. Every page read at every durable LSN observed before the kill
// reads back the same after it; at the end the pages equal Postgres' data
// files (masked); and a third process on an empty local disk with no
// safekeepers serves the same pages from the object store alone.
func TestKillPageserverDuringIngest(t *testing.T) { killDuringIngest(t, false) }

// TestReplacePageserverDuringIngest is TestKillPageserverDuringIngest with
// the second process on an empty local disk: a replacement machine that
// has only the object store, whose manifest was published while versions
// sat in memory, and the safekeepers. It must resume WAL ingest where the
// object store's layers end (the end of a WAL record) and then serve
// every snapshot taken from the first process.
func TestReplacePageserverDuringIngest(t *testing.T) { killDuringIngest(t, true) }

func killDuringIngest(t *testing.T, emptyDisk bool) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	srv := pgtest.Start(t, pgtest.Options{Conf: map[string]string{
		"full_page_writes":          "on",
		"autovacuum":                "off",
		"synchronous_standby_names": syncConf,
		"max_wal_size":              "'1GB'",
		"checkpoint_timeout":        "'30min'",
		"wal_sender_timeout":        "'10s'",
		"shared_buffers":            "16MB",
	}})
	srv.Stop()
	w0 := controlCheckpoint(t, srv.DataDir)
	skNodes := startSafekeeperNodes(t, srv.Port)
	var sks []string
	for _, n := range skNodes {
		sks = append(sks, n.addr)
	}
	storeDir, psDir := t.TempDir(), t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t))
	// Every run names the bootstrap folder: only the first imports it.
	common := []string{"--data-dir", psDir, "--listen", addr, "--store", storeDir,
		"--safekeepers", strings.Join(sks, ","), "--timeline", tlID.String(), "--bootstrap-from", srv.DataDir}

	var mu sync.Mutex // guards cur
	cur := startProc(t, "ps1.log", append(common, "--faults-for", "4s", "--fault-seed", "1")...)
	srv.Launch()
	waitFor(t, 60*time.Second, "the base durable and ingest running", func() bool {
		i := cur.info(t)
		return i.LSNs.Durable >= w0 && i.LSNs.LastRecord > w0
	})
	if out, err := srv.Pgbench("-i", "-s", "1", "postgres"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	rels := relFiles(t, srv, "pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "pgbench_accounts_pkey", "pgbench_branches_pkey")
	var keys []pg.PageKey
	for _, r := range rels {
		n, _ := strconv.Atoi(srv.QueryString("postgres", fmt.Sprintf("SELECT (pg_relation_size('%s') / 8192)::text", r.name)))
		for b := 0; b < n+2; b += 23 {
			keys = append(keys, r.tag.Page(uint32(b)))
		}
	}

	secs := "8"
	if longTests() {
		secs = "60"
	}
	benchDone := make(chan error, 1)
	go func() {
		out, err := srv.Pgbench("-c", "4", "-j", "2", "-T", secs, "postgres")
		if err != nil {
			err = fmt.Errorf("%v\n%s", err, out)
		}
		benchDone <- err
	}()
	var snaps []snapshot
	stopRec := make(chan struct{})
	recDone := make(chan struct{})
	go func() {
		defer close(recDone)
		for {
			select {
			case <-stopRec:
				return
			case <-time.After(200 * time.Millisecond):
			}
			mu.Lock()
			c := cur.c
			mu.Unlock()
			if c == nil {
				continue
			}
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			infos, err := c.ListTimelines(rctx)
			// Durable 0 says nothing (a restarted timeline reports 0 until
			// its first sync); request LSN 0 would mean "latest".
			if err == nil && len(infos) > 0 && infos[0].LSNs.Durable > 0 {
				var s snapshot
				if s, err = readSnapshot(rctx, c, infos[0].LSNs.Durable, keys); err == nil {
					snaps = append(snaps, s)
				}
			}
			cancel()
		}
	}()

	time.Sleep(4 * time.Second)
	if emptyDisk {
		// The replacement has only the object store: the imported base
		// must be there (at a slow start the first uploads still wait out
		// the injected faults at 4 s; without the base there is nothing
		// to replace, see TestReplaceBeforeBaseUploaded).
		waitFor(t, 60*time.Second, "the base in the object store", func() bool {
			return cur.info(t).LSNs.RemoteConsistent >= w0
		})
	}
	mu.Lock()
	old := cur
	cur = &proc{}
	mu.Unlock()
	before := old.info(t)
	old.kill9()
	t.Logf("first process: %d object store faults injected", faultsFired(t, old))
	t.Logf("killed -9 the pageserver (incarnation %x) at %+v", old.inc, before.LSNs)
	time.Sleep(300 * time.Millisecond)
	args2 := slices.Clone(common)
	if emptyDisk {
		args2[1] = t.TempDir() // --data-dir
	}
	p2 := startProc(t, "ps2.log", append(args2, "--faults-for", "3s", "--fault-seed", "2")...)
	if p2.inc == old.inc {
		t.Fatal("same incarnation after a restart")
	}
	if _, err := os.Stat(filepath.Join(psDir, "bootstrap-"+tlID.String()+".done")); err != nil && !emptyDisk {
		t.Fatalf("bootstrap marker: %v", err)
	}
	if emptyDisk {
		t.Logf("the replacement on an empty disk resumes WAL ingest at %s", p2.info(t).LSNs.LastRecord)
	}
	if b, _ := os.ReadFile(p2.log); bytes.Contains(b, []byte("timeline bootstrapped")) {
		t.Fatal("the restarted pageserver imported the bootstrap folder again")
	}
	mu.Lock()
	cur = p2
	mu.Unlock()
	if err := <-benchDone; err != nil {
		t.Fatal(err)
	}
	close(stopRec)
	<-recDone
	// pgbench truncates pgbench_history at start: a new relfilenode.
	rels = relFiles(t, srv, "pgbench_accounts", "pgbench_branches", "pgbench_tellers", "pgbench_history", "pgbench_accounts_pkey", "pgbench_branches_pkey")
	x := mustLSN(t, srv.QueryString("postgres", "SELECT pg_current_wal_insert_lsn()::text"))
	srv.Exec("postgres", "CHECKPOINT")
	srv.Stop()
	wEnd := controlCheckpoint(t, srv.DataDir)
	lastReport := time.Now()
	waitFor(t, 2*time.Minute, "ingest past the shutdown checkpoint", func() bool {
		i := p2.info(t)
		if i.LSNs.LastRecord <= wEnd && time.Since(lastReport) > 20*time.Second {
			lastReport = time.Now()
			var fl []string
			for _, n := range skNodes {
				st := n.n.Status()
				fl = append(fl, fmt.Sprintf("%s flush %s commit %s", st.ID, st.FlushLSN, st.CommitLSN))
			}
			t.Logf("waiting for ingest past the shutdown checkpoint %s: pageserver LSNs %+v; safekeepers: %s", wEnd, i.LSNs, strings.Join(fl, ", "))
		}
		return i.LSNs.LastRecord > wEnd
	})

	n := checkSnapshots(t, "after kill -9 and restart", p2.c, snaps, pg.LSN(^uint64(0)))
	t.Logf("%d snapshots at durable LSNs %s..%s; %d page reads equal after the restart", len(snaps), snaps[0].lsn, snaps[len(snaps)-1].lsn, n)
	if len(snaps) < 10 {
		t.Fatalf("only %d snapshots", len(snaps))
	}
	np := comparePages(t, p2.c, tlID, srv.DataDir, rels, client.LatestLSN, 1)
	t.Logf("%d pages equal Postgres' data files (masked)", np)
	if t.Failed() {
		t.FailNow()
	}

	// Object store alone: wait until the pages are published, then a
	// process on an empty disk without safekeepers.
	waitFor(t, 2*time.Minute, "upload past "+x.String(), func() bool { return p2.info(t).LSNs.RemoteConsistent >= x })
	remote := p2.info(t).LSNs.RemoteConsistent
	p2.kill9()
	t.Logf("second process: %d object store faults injected", faultsFired(t, p2))
	p3 := startProc(t, "ps3.log", "--data-dir", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t)), "--store", storeDir)
	n3 := checkSnapshots(t, "empty disk", p3.c, snaps, remote)
	np3 := comparePages(t, p3.c, tlID, srv.DataDir, rels, client.LatestLSN, 1)
	t.Logf("empty local disk, object store alone (remote consistent %s): %d snapshot reads and %d pages equal", remote, n3, np3)

	// A replacement pageserver on an empty disk, bound to the safekeepers:
	// it resumes WAL ingest where the object store's layers end (which
	// must be the end of a WAL record) and catches up to the end.
	p3.kill9()
	p4 := startProc(t, "ps4.log", "--data-dir", t.TempDir(), "--listen", fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t)), "--store", storeDir,
		"--safekeepers", strings.Join(sks, ","), "--timeline", tlID.String())
	resume := p4.info(t).LSNs.LastRecord
	if resume%8 != 0 {
		t.Fatalf("the replacement pageserver resumes WAL ingest at %s, inside a WAL record", resume)
	}
	waitFor(t, time.Minute, "the replacement's ingest past the shutdown checkpoint", func() bool { return p4.info(t).LSNs.LastRecord > wEnd })
	np4 := comparePages(t, p4.c, tlID, srv.DataDir, rels, client.LatestLSN, 1)
	t.Logf("empty local disk with the safekeepers: ingest resumed at %s, caught up past %s, %d pages equal", resume, wEnd, np4)
}

// TestReplaceBeforeBaseUploaded: a pageserver on an empty disk that is
// told to bootstrap a timeline from a data directory Postgres has run on
// since (the setup of the replacement above) starts when the object store
// holds the timeline, and otherwise stops with an error that says the
// timeline is in neither place, instead of importing pages that are newer
// than the checkpoint they would be filed under.
func TestReplaceBeforeBaseUploaded(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	srv := pgtest.Start(t, pgtest.Options{})
	srv.Stop()
	uploaded, other := objectstore.NewMemory(), objectstore.NewMemory()
	run := func(store objectstore.Store, ready func()) error {
		cfg := pageserver.DefaultConfig()
		cfg.DataDir = t.TempDir()
		cfg.ListenAddr = "127.0.0.1:0"
		cfg.MetricsAddr = ""
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		return service.Run(ctx, service.Options{Config: cfg, Store: store, Log: testLog(t), Timeline: tlID, BootstrapFrom: srv.DataDir,
			Ready: func(string, *pageserver.Pageserver) { ready(); cancel() }})
	}
	// The first pageserver imports the stopped directory; a graceful stop
	// publishes it.
	imported := false
	if err := run(uploaded, func() { imported = true }); err != nil || !imported {
		t.Fatalf("first pageserver: ready %v, %v", imported, err)
	}
	srv.Launch()
	srv.Exec("postgres", "CREATE TABLE t AS SELECT 1 AS x")
	err := run(other, func() { t.Error("a replacement with an empty object store served") })
	if !errors.Is(err, service.ErrBootstrap) || !strings.Contains(err.Error(), "neither on this disk nor in the object store") {
		t.Fatalf("replacement with an empty object store: %v", err)
	}
	t.Logf("replacement with an empty object store: %v", err)
	served := false
	if err := run(uploaded, func() { served = true }); err != nil || !served {
		t.Fatalf("replacement with the uploaded base: ready %v, %v", served, err)
	}
}
