package agent

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/redobackend"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

func controlBytes(version uint32, ckpt, redo pg.LSN, tli uint32) []byte {
	b := make([]byte, 8192)
	le := binary.LittleEndian
	le.PutUint64(b[0:], 7300000000000000001)
	le.PutUint32(b[8:], version)
	le.PutUint32(b[16:], 6) // DB_IN_PRODUCTION
	le.PutUint64(b[32:], uint64(ckpt))
	le.PutUint64(b[40:], uint64(redo))
	le.PutUint32(b[48:], tli)
	return b
}

func TestParseControl(t *testing.T) {
	c, err := ParseControl(controlBytes(1300, 0x1700100, 0x16FFF00, 1))
	if err != nil || c.Checkpoint != 0x1700100 || c.Redo != 0x16FFF00 || c.Timeline != 1 || c.SystemID != 7300000000000000001 {
		t.Fatalf("%+v %v", c, err)
	}
	for name, b := range map[string][]byte{
		"short":         make([]byte, 20),
		"version 1201":  controlBytes(1201, 0x1700100, 0x16FFF00, 1),
		"redo past ckp": controlBytes(1300, 0x1700100, 0x1800000, 1),
		"no timeline":   controlBytes(1300, 0x1700100, 0x16FFF00, 0),
	} {
		if _, err := ParseControl(b); !errors.Is(err, ErrControl) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestParseRealControl reads the pg_control that initdb writes.
func TestParseRealControl(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	dir := pgtest.MkdirOwned(t, "strata-control-")
	cmd, err := pgtest.Command("initdb", "-D", filepath.Join(dir, "d"), "--no-sync", "-A", "trust", "-U", "postgres")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "d", ControlFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseControl(b)
	if err != nil {
		t.Fatal(err)
	}
	// initdb ends with a shutdown checkpoint in the first segment; its REDO
	// point is the checkpoint record itself.
	if c.Timeline != 1 || c.Redo != c.Checkpoint || c.Checkpoint.Segment(pg.WALSegmentSize) != 1 || c.SystemID == 0 {
		t.Fatalf("initdb's pg_control: %+v", c)
	}
}

func TestPrintReport(t *testing.T) {
	var buf bytes.Buffer
	err := PrintReport(&buf, Report{State: "running", Term: 3, Strategy: "lfc", CacheHits: 30, CacheMisses: 10,
		Waits: []WaitStat{{Name: "getpage", Count: 10, Total: 5 * time.Millisecond}, {Name: "lfc_lock", Count: 4, Total: 40 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.Contains(out, "75.0% hits") || len(lines) != 5 || !strings.Contains(lines[3], "lfc_lock") || !strings.Contains(lines[3], "10ms") || !strings.Contains(lines[4], "500") {
		t.Fatalf("report:\n%s", out)
	}
}

func TestPrintReportLFC(t *testing.T) {
	var buf bytes.Buffer
	r := Report{State: "running", Strategy: "lfc", LFC: &LFCReport{CapacityBytes: 64 << 20, UsedBytes: 3 << 19, BudgetBytes: 384 << 20, Advisor: "running (pid 7, every 5s, 1 launches)"}}
	if err := PrintReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	if want := "lfc: 1.5 MiB of 64.0 MiB in use (budget 384.0 MiB); advisor running (pid 7, every 5s, 1 launches)\n"; !strings.Contains(buf.String(), want) {
		t.Fatalf("report:\n%s\nwant the line %q", buf.String(), want)
	}
}

func TestPrintReportReadAhead(t *testing.T) {
	var buf bytes.Buffer
	if err := PrintReport(&buf, Report{State: "running", Strategy: "shared-buffers", ReadAhead: ReadAheadReport{Fetched: 640, Used: 600, Dropped: 40, Batches: 10}}); err != nil {
		t.Fatal(err)
	}
	if want := "read-ahead: 640 pages fetched in 10 batches, 600 used, 40 dropped unread\n"; !strings.Contains(buf.String(), want) {
		t.Fatalf("report:\n%s\nwant the line %q", buf.String(), want)
	}
	buf.Reset()
	if err := PrintReport(&buf, Report{State: "running", Strategy: "shared-buffers"}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "read-ahead") {
		t.Fatalf("a read-ahead line with nothing fetched:\n%s", buf.String())
	}
	if strings.Contains(buf.String(), "W lookups") {
		t.Fatalf("a W lookups line with no lookup:\n%s", buf.String())
	}
	buf.Reset()
	if err := PrintReport(&buf, Report{State: "running", Strategy: "shared-buffers", WALLookups: WALLookupReport{Walked: 12, Unchanged: 340}}); err != nil {
		t.Fatal(err)
	}
	if want := "W lookups: 12 walked new WAL, 340 found pg_wal unchanged\n"; !strings.Contains(buf.String(), want) {
		t.Fatalf("report:\n%s\nwant the line %q", buf.String(), want)
	}
}

// TestPrintReportRedoStore: in redo mode the report shows the local page
// store; in writeback mode (no store) it does not.
func TestPrintReportRedoStore(t *testing.T) {
	var buf bytes.Buffer
	r := Report{State: "running", Strategy: "shared-buffers", PageSource: "redo", RedoStore: &redobackend.Stats{Pages: 120, Pinned: 7, Evicted: 30, Refetches: 2}}
	if err := PrintReport(&buf, r); err != nil {
		t.Fatal(err)
	}
	if want := "redo store (redo): 120 pages, 7 pinned, 30 evicted, 2 re-read at the WAL position\n"; !strings.Contains(buf.String(), want) {
		t.Fatalf("report:\n%s\nwant the line %q", buf.String(), want)
	}
	b, err := json.Marshal(r)
	if err != nil || !strings.Contains(string(b), `"redo_store":{"pages":120,"pinned":7,"evicted":30,"refetches":2}`) {
		t.Fatalf("JSON report %s, %v", b, err)
	}
	buf.Reset()
	if err := PrintReport(&buf, Report{State: "running", Strategy: "shared-buffers", PageSource: "writeback"}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "redo store") {
		t.Fatalf("a redo store line in writeback mode:\n%s", buf.String())
	}
}

func TestPrintReportPrewarm(t *testing.T) {
	for _, c := range []struct {
		p    PrewarmReport
		want string
	}{
		{PrewarmReport{State: "done", List: "prewarm/ab/1", Total: 12, Loaded: 10, Cached: 1, Skipped: 1, Took: "289ms"},
			"prewarm done: 10 of 12 pages loaded (1 already cached, 1 skipped) in 289ms from prewarm/ab/1\n"},
		{PrewarmReport{State: "failed", List: "prewarm/ab/9", Error: "prewarm: corrupt page list"},
			"prewarm failed, the LFC started cold: prewarm: corrupt page list\n"},
		{PrewarmReport{State: "failed", List: "prewarm/ab/9", Total: 5, Loaded: 2, Took: "1s", Error: "pageserver down"},
			"prewarm failed: 2 of 5 pages loaded (0 already cached, 0 skipped) in 1s from prewarm/ab/9: pageserver down\n"},
		{PrewarmReport{State: "none"}, "prewarm: no page list was saved for this timeline\n"},
	} {
		var buf bytes.Buffer
		p := c.p
		if err := PrintReport(&buf, Report{State: "running", Strategy: "lfc", Prewarm: &p}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), c.want) {
			t.Errorf("report:\n%s\nwant the line %q", buf.String(), c.want)
		}
	}
}

func TestPrintReportSharedBuffers(t *testing.T) {
	var buf bytes.Buffer
	if err := PrintReport(&buf, Report{State: "running", Strategy: StrategySharedBuffers}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "cache shared-buffers: no LFC; shared_buffers misses read from the pageserver (getpage)") {
		t.Errorf("report:\n%s", buf.String())
	}
}

// TestPrewarmerIgnoresEarlierStarts: a prewarm cut off by a restart may end
// after the next start's began; its last words must not overwrite the
// report of the current one.
func TestPrewarmerIgnoresEarlierStarts(t *testing.T) {
	p := newPrewarmer(&Agent{cfg: Config{Cache: CacheConfig{Strategy: StrategyLFC, Prewarm: true}}})
	p.start = 2
	p.set(2, PrewarmReport{State: "loading", Total: 10})
	p.set(1, PrewarmReport{State: "failed", Error: "context canceled"})
	p.progress(1, fusefs.PrewarmStats{Total: 99, Loaded: 3}, "failed", nil)
	if r := p.report(); r.State != "loading" || r.Total != 10 {
		t.Fatalf("report after an earlier start's updates: %+v", r)
	}
	p.progress(2, fusefs.PrewarmStats{Total: 10, Loaded: 10}, "done", nil)
	if r := p.report(); r.State != "done" || r.Loaded != 10 {
		t.Fatalf("report after the current start's end: %+v", r)
	}
}

// TestHealthz: the agent's /healthz is 200 only while Postgres runs.
func TestHealthz(t *testing.T) {
	a := &Agent{reg: prometheus.NewRegistry(), state: "mounting"}
	h := a.Handler()
	for _, c := range []struct {
		state string
		code  int
	}{{"mounting", 503}, {"running", 200}, {"stopping", 503}} {
		a.setStateQuiet(c.state)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		if rec.Code != c.code || strings.TrimSpace(rec.Body.String()) != c.state {
			t.Errorf("state %s: %d %q, want %d", c.state, rec.Code, rec.Body.String(), c.code)
		}
	}
}

func (a *Agent) setStateQuiet(s string) {
	a.mu.Lock()
	a.state = s
	a.mu.Unlock()
}

// TestPrintReportProgress: a start or stop under way is a line of its own.
func TestPrintReportProgress(t *testing.T) {
	for _, c := range []struct {
		p    Progress
		want string
	}{
		{Progress{Step: "fetching WAL", FetchedSegments: 3, FetchSegments: 9, Elapsed: "4s", Idle: "0s"},
			"starting: fetching WAL from the safekeepers: 3 of 9 segments, for 4s (last progress 0s ago)"},
		{Progress{Step: "stopping", MountOps: 1200, Elapsed: "31s", Idle: "1s"},
			"stopping: postgres shutting down (1200 reads and writes on the mount), for 31s (last progress 1s ago)"},
		{Progress{Step: "importing /data", ImportBytes: 800 << 20, MountWritten: 200 << 20, Elapsed: "2s", Idle: "0s"},
			"starting: importing /data: 200.0 MiB of 800.0 MiB copied (25%), for 2s (last progress 0s ago)"},
	} {
		var buf bytes.Buffer
		if err := PrintReport(&buf, Report{State: c.p.Step, Strategy: "lfc", Progress: &c.p}); err != nil {
			t.Fatal(err)
		}
		if lines := strings.Split(buf.String(), "\n"); len(lines) < 2 || lines[1] != c.want {
			t.Errorf("report:\n%s\nwant its second line %q", buf.String(), c.want)
		}
	}
	var buf bytes.Buffer
	if err := PrintReport(&buf, Report{State: "running", Strategy: "lfc"}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "starting") || strings.Contains(buf.String(), "stopping") {
		t.Errorf("a running compute's report speaks of a start or stop:\n%s", buf.String())
	}
}
