package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/service"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

var tlID = pg.TimelineID{0xE2, 0xE0, 1}

func longTests() bool { return os.Getenv("STRATA_LONG_TESTS") == "1" }

// testLog is the logger of the in-process servers: with STRATA_E2E_LOG=1
// every line goes to the test log; otherwise the last lines are kept and a
// failed test logs them, so that a failure in CI says what the servers
// did before it.
func testLog(t testing.TB) zerolog.Logger {
	if os.Getenv("STRATA_E2E_LOG") == "1" {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	}
	r := &logTail{max: 24 << 10}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("last log lines of the in-process servers:\n%s", r.String())
		}
	})
	return zerolog.New(r).Level(zerolog.InfoLevel).With().Timestamp().Logger()
}

// logTail keeps the last max bytes written to it, cut at a line start. A
// line that repeats the one before it but for its time (a reconnect loop)
// is counted, not kept.
type logTail struct {
	mu      sync.Mutex
	max     int
	buf     []byte
	prev    string // the last kept line without its time
	repeats int
}

var logTime = regexp.MustCompile(`"time":"[^"]*"`)

func (l *logTail) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	key := logTime.ReplaceAllString(string(p), "")
	if key == l.prev {
		l.repeats++
		return len(p), nil
	}
	if l.repeats > 0 {
		l.buf = fmt.Appendf(l.buf, "(the line above repeated %d more times)\n", l.repeats)
	}
	l.prev, l.repeats = key, 0
	l.buf = append(l.buf, p...)
	if len(l.buf) > 2*l.max {
		cut := len(l.buf) - l.max
		if i := bytes.IndexByte(l.buf[cut:], '\n'); i >= 0 {
			cut += i + 1
		}
		l.buf = append([]byte(nil), l.buf[cut:]...)
	}
	return len(p), nil
}

func (l *logTail) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buf
	if l.repeats > 0 {
		b = fmt.Appendf(append([]byte(nil), b...), "(the line above repeated %d more times)\n", l.repeats)
	}
	if len(b) > l.max {
		b = b[len(b)-l.max:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func mustLSN(t *testing.T, s string) pg.LSN {
	t.Helper()
	l, err := pg.ParseLSN(strings.TrimSpace(s))
	if err != nil {
		t.Fatalf("LSN %q: %v", s, err)
	}
	return l
}

// skNode is an in-process safekeeper.
type skNode struct {
	addr string
	n    *safekeeper.Node
	stop func() // idempotent
}

// startSafekeepers runs three in-process safekeepers that stream from the
// Postgres on 127.0.0.1:pgPort (as application names sk1..sk3, peers of
// each other) and returns their gRPC addresses. They stop at cleanup.
func startSafekeepers(t testing.TB, pgPort int) []string {
	var addrs []string
	for _, n := range startSafekeeperNodes(t, pgPort) {
		addrs = append(addrs, n.addr)
	}
	return addrs
}

func startSafekeeperNodes(t testing.TB, pgPort int) []*skNode {
	t.Helper()
	var nodes []*skNode
	for i := 0; i < 3; i++ {
		nodes = append(nodes, &skNode{addr: fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t))})
	}
	for i, sk := range nodes {
		cfg := safekeeper.DefaultConfig()
		cfg.ID = fmt.Sprintf("sk%d", i+1)
		cfg.DataDir = t.TempDir()
		cfg.ListenAddr = sk.addr
		cfg.Postgres = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", pgPort)
		cfg.StatusInterval = 100 * time.Millisecond
		cfg.ReconnectDelay = 100 * time.Millisecond
		cfg.ControlSyncInterval = 200 * time.Millisecond
		cfg.VerifyOnStart = false
		for j, o := range nodes {
			if j != i {
				cfg.Peers = append(cfg.Peers, o.addr)
			}
		}
		n, err := safekeeper.New(cfg, safekeeper.Deps{Logger: testLog(t).With().Str("sk", cfg.ID).Logger()})
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Listen(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { n.Run(ctx); close(done) }()
		sk.n = n
		sk.stop = func() { cancel(); <-done }
		t.Cleanup(sk.stop)
	}
	return nodes
}

// skReport says where each safekeeper's WAL and commit LSN are, for a
// test that waits in vain for durability.
func skReport(nodes []*skNode) string {
	var b strings.Builder
	for _, n := range nodes {
		st := n.n.Status()
		fmt.Fprintf(&b, "%s: term %d, flush %s, commit %s; ", st.ID, st.Term, st.FlushLSN, st.CommitLSN)
	}
	return strings.TrimSuffix(b.String(), "; ")
}

// syncConf is the Postgres setting that makes commits wait for two of the
// three safekeepers.
const syncConf = "'ANY 2 (sk1, sk2, sk3)'"

// psHandle is an in-process pageserver service (core/pageserver/service,
// the code `strata pageserver` runs).
type psHandle struct {
	ps   *pageserver.Pageserver
	addr string
	c    *client.Client
	stop func()
}

func startPageserver(t *testing.T, cfg pageserver.Config, store objectstore.Store, sks []string) *psHandle {
	t.Helper()
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.MetricsAddr = ""
	ctx, cancel := context.WithCancel(context.Background())
	type ready struct {
		addr string
		ps   *pageserver.Pageserver
	}
	rc := make(chan ready, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- service.Run(ctx, service.Options{Config: cfg, Store: store, Log: testLog(t).With().Str("c", "pageserver").Logger(),
			Safekeepers: sks, Timeline: tlID,
			Ready: func(addr string, ps *pageserver.Pageserver) { rc <- ready{addr, ps} }})
	}()
	var r ready
	select {
	case r = <-rc:
	case err := <-errc:
		cancel()
		t.Fatalf("pageserver service: %v", err)
	}
	c, err := client.Dial(r.addr)
	if err != nil {
		t.Fatal(err)
	}
	h := &psHandle{ps: r.ps, addr: r.addr, c: c}
	stopped := false
	h.stop = func() {
		if stopped {
			return
		}
		stopped = true
		c.Close()
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("pageserver service: %v", err)
		}
	}
	t.Cleanup(h.stop)
	return h
}

// controlCheckpoint returns "Latest checkpoint location" of a stopped (or
// running) data directory.
func controlCheckpoint(t *testing.T, dir string) pg.LSN {
	t.Helper()
	out, err := exec.Command(pgtest.Bin("pg_controldata"), "-D", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("pg_controldata: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`(?m)^Latest checkpoint location:\s+(\S+)$`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("pg_controldata: no checkpoint location in\n%s", out)
	}
	return mustLSN(t, string(m[1]))
}

// relFile is a relation's main fork as Postgres names it.
type relFile struct {
	name string
	path string // relative to the data directory, e.g. base/5/16384
	rm   wal.RmgrID
	tag  pg.RelTag
}

// relFiles lists the main forks of the named relations (kind r: heap, i:
// btree), from a running server.
func relFiles(t *testing.T, srv *pgtest.Server, names ...string) []relFile {
	t.Helper()
	var out []relFile
	for _, n := range names {
		row := srv.QueryString("postgres", fmt.Sprintf("SELECT pg_relation_filepath(oid) || ' ' || relkind::text FROM pg_class WHERE relname = '%s'", n))
		out = append(out, parseRelRow(t, n, row))
	}
	return out
}

func parseRelRow(t *testing.T, name, row string) relFile {
	t.Helper()
	f := strings.Fields(row)
	if len(f) != 2 {
		t.Fatalf("relation %s: %q", name, row)
	}
	r := relFile{name: name, path: f[0]}
	if _, err := fmt.Sscanf(f[0], "base/%d/%d", &r.tag.DB, &r.tag.Rel); err != nil {
		t.Fatalf("relation path %q: %v", f[0], err)
	}
	r.tag.Spc = 1663
	r.rm = wal.RmHeap
	if f[1] == "i" {
		r.rm = wal.RmBtree
	}
	return r
}

// comparePages compares every page of the relations' data files (of a
// stopped, checkpointed data directory) with GetPage at lsn, both masked as
// Postgres masks them for its consistency checks; every sample-th page
// (1: all). It returns the number of pages compared.
func comparePages(t *testing.T, c *client.Client, tl pg.TimelineID, dataDir string, rels []relFile, lsn pg.LSN, sample int) int {
	t.Helper()
	ctx := context.Background()
	total := 0
	for _, r := range rels {
		file, err := os.ReadFile(filepath.Join(dataDir, r.path))
		if err != nil {
			t.Fatal(err)
		}
		nfile := uint32(len(file) / pg.BlockSize)
		sz, err := c.Nblocks(ctx, tl, []pg.RelTag{r.tag}, lsn, 0)
		if err != nil {
			t.Fatalf("%s: Nblocks: %v", r.name, err)
		}
		// Postgres extends heaps by several blocks at once under
		// contention without WAL-logging the empty ones: WAL ingest knows
		// a relation up to its last logged block, the file may have
		// all-zero pages past it.
		for nfile > sz[0].Nblocks && isZero(file[int(nfile-1)*pg.BlockSize:int(nfile)*pg.BlockSize]) {
			nfile--
		}
		if !sz[0].Exists || sz[0].Nblocks != nfile {
			t.Errorf("%s: pageserver has %d blocks (exists %v), the data file %d", r.name, sz[0].Nblocks, sz[0].Exists, nfile)
			continue
		}
		var reqs []client.PageRequest
		for b := uint32(0); b < nfile; b++ {
			if sample > 1 && b%uint32(sample) != 0 && b != nfile-1 {
				continue
			}
			reqs = append(reqs, client.PageRequest{Page: r.tag.Page(b), RequestLSN: lsn})
		}
		for len(reqs) > 0 {
			batch := reqs[:min(len(reqs), 256)]
			reqs = reqs[len(batch):]
			res, err := c.GetPages(ctx, tl, batch)
			if err != nil {
				t.Fatalf("%s: GetPages: %v", r.name, err)
			}
			for i, pr := range res {
				blk := batch[i].Page.Block
				if pr.Err != nil {
					t.Errorf("%s block %d: %v", r.name, blk, pr.Err)
					continue
				}
				got := bytes.Clone(pr.Data)
				want := bytes.Clone(file[int(blk)*pg.BlockSize : int(blk+1)*pg.BlockSize])
				postgres.Mask(r.rm, got, blk)
				postgres.Mask(r.rm, want, blk)
				if !bytes.Equal(got, want) {
					t.Errorf("%s block %d differs from the data file after masking", r.name, blk)
				}
				total++
			}
		}
	}
	return total
}

func isZero(b []byte) bool {
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}

// untar extracts a tar stream into dir.
func untar(t *testing.T, r io.Reader, dir string) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		hd, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(hd.Name))
		switch hd.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o700); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}
	}
}

// fetchWAL writes the committed WAL from the start of from's segment, read
// from a safekeeper, into pg_wal of dir as whole 16 MiB segment files of
// timeline 1 (zeros past the end). It returns the end.
func fetchWAL(t *testing.T, sk string, dir string, from pg.LSN) pg.LSN {
	t.Helper()
	cl, err := server.Dial(sk)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := cl.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A safekeeper's own commit LSN trails the group's by up to its idle
	// peer poll (a second): wait, bounded, for it to reach the WAL it has
	// flushed (all of it, once Postgres has stopped), else the fetched WAL
	// can end before the last checkpoint record (seen in CI).
	for need, deadline := st.FlushLSN, time.Now().Add(10*time.Second); st.CommitLSN < need && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
		if st, err = cl.Status(ctx); err != nil {
			t.Fatal(err)
		}
	}
	to := st.CommitLSN
	seg := pg.LSN(pg.WALSegmentSize)
	start := from - from%seg
	if st.StartLSN > start || to < from {
		t.Fatalf("safekeeper %s holds %s..%s, need %s..", sk, st.StartLSN, to, start)
	}
	buf := make([]byte, 0, int(to-start))
	if err := cl.ReadWAL(ctx, start, to, server.BoundCommit, func(_ pg.LSN, d []byte) error {
		buf = append(buf, d...)
		return nil
	}); err != nil {
		t.Fatalf("reading WAL %s..%s from %s: %v", start, to, sk, err)
	}
	for off := pg.LSN(0); off < pg.LSN(len(buf)); off += seg {
		data := make([]byte, seg)
		copy(data, buf[off:])
		no := uint64(start+off) / uint64(seg)
		name := fmt.Sprintf("%08X%08X%08X", 1, no/0x100, no%0x100)
		if err := os.WriteFile(filepath.Join(dir, "pg_wal", name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

// chownTree gives dir to the postgres OS user.
func chownTree(t *testing.T, dir string) {
	t.Helper()
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return pgtest.Chown(p)
	}); err != nil {
		t.Fatal(err)
	}
}

// pgProc is a stock postmaster started on a folder with extra -c settings.
type pgProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	port int
	log  string
	done chan error
}

func startPGOn(t *testing.T, pgdata, sockDir string, port int, settings ...string) *pgProc {
	t.Helper()
	args := []string{"-D", pgdata, "-p", strconv.Itoa(port), "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=" + sockDir}
	for _, s := range settings {
		args = append(args, "-c", s)
	}
	cmd, err := pgtest.Command("postgres", args...)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(sockDir, fmt.Sprintf("postgres-%d.log", port))
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	p := &pgProc{t: t, cmd: cmd, port: port, log: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(p.stop)
	return p
}

func (p *pgProc) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
}

func (p *pgProc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// stop is a fast shutdown; SIGKILL after a minute.
func (p *pgProc) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.t.Errorf("Postgres on port %d did not stop within 60 s of SIGINT: killed", p.port)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
}

// psql runs one query with psql and returns its unaligned output.
func (p *pgProc) psql(sql string) (string, error) {
	cmd, err := pgtest.Command("psql", "-h", "127.0.0.1", "-p", strconv.Itoa(p.port), "-U", "postgres", "-XAtc", sql, "postgres")
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
