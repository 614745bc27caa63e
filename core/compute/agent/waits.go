package agent

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/redobackend"
	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/core/metrics"
	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

// Wait kinds of the report besides the LFC's (cache.WaitLFCLock,
// cache.WaitLFCRead, cache.WaitLFCWrite).
const (
	WaitGetPage   = "getpage"    // a page read from the pageserver on a cache miss
	WaitFsync     = "fsync"      // an fsync: durability wait (or send, in recovery)
	WaitFUSERead  = "fuse_read"  // a whole FUSE read of a relation file (includes the above)
	WaitFUSEWrite = "fuse_write" // a FUSE write of a relation file (page sent to storage)
	WaitWALWrite  = "wal_write"  // a pg_wal write to local scratch
)

// WaitStat is one kind of wait the agent imposed on Postgres.
type WaitStat struct {
	Name  string        `json:"name"`
	Count int64         `json:"count"`
	Total time.Duration `json:"total_ns"`
}

// Mean is Total / Count.
func (w WaitStat) Mean() time.Duration {
	if w.Count == 0 {
		return 0
	}
	return w.Total / time.Duration(w.Count)
}

// Report is the agent's state and wait accounting (`strata compute waits`).
type Report struct {
	State       string     `json:"state"`
	Term        uint64     `json:"term"`
	DurableEnd  pg.LSN     `json:"durable_end"` // E of the last election
	W           pg.LSN     `json:"w"`           // WAL position written
	Durable     pg.LSN     `json:"durable"`     // pageserver durable LSN (FreshReport: asked for now)
	Restarts    int        `json:"restarts"`
	ColdStart   string     `json:"cold_start"` // storage to accepting connections, last start
	Strategy    string     `json:"strategy"`
	CacheHits   uint64     `json:"cache_hits"`
	CacheMisses uint64     `json:"cache_misses"`
	Uptime      string     `json:"uptime"`
	Waits       []WaitStat `json:"waits"`
	// PageSource is writeback or redo; RedoStore the local page store's
	// sizes in redo mode.
	PageSource string             `json:"page_source,omitempty"`
	RedoStore  *redobackend.Stats `json:"redo_store,omitempty"`
	// Prewarm is the LFC prewarm of the last start (lfc strategy only).
	Prewarm *PrewarmReport `json:"prewarm,omitempty"`
	// ReadAhead counts the pages fetched ahead of sequential readers
	// (compute.read_ahead) since the mount.
	ReadAhead ReadAheadReport `json:"read_ahead"`
	// WALLookups counts the W lookups since the mount, pg_wal out of it.
	WALLookups WALLookupReport `json:"wal_lookups"`
	// LFC is the LFC's size now (lfc strategy, while mounted).
	LFC *LFCReport `json:"lfc,omitempty"`
	// Progress is how far the start or the stop of Postgres under way
	// got (nil while none runs).
	Progress *Progress `json:"progress,omitempty"`
}

// LFCReport is the LFC's size: a cache advisor, when one runs, moves the
// capacity within the budget (the plan's LFC share).
type LFCReport struct {
	CapacityBytes int64  `json:"capacity_bytes"`
	UsedBytes     int64  `json:"used_bytes"`
	BudgetBytes   int64  `json:"budget_bytes"`
	Advisor       string `json:"advisor,omitempty"` // the advisor plugin's state; empty: none configured
}

// ReadAheadReport is the read-ahead's counters: pages fetched in batches,
// pages a reader used, pages dropped unread.
type ReadAheadReport struct {
	Fetched uint64 `json:"fetched"`
	Used    uint64 `json:"used"`
	Dropped uint64 `json:"dropped"`
	Batches uint64 `json:"batches"`
}

// WALLookupReport counts W lookups (pg_wal out of the mount): walks of
// the WAL written since the walk before, and answers without one (the
// folder's watch saw no change since).
type WALLookupReport struct {
	Walked    int64 `json:"walked"`
	Unchanged int64 `json:"unchanged"`
}

// fsWaits turns the filesystem's counters into report lines.
func fsWaits(w *fusefs.Waits) []WaitStat {
	if w == nil {
		return nil
	}
	sum := func(op fusefs.Op, kinds ...relpath.Kind) WaitStat {
		var s WaitStat
		for _, k := range kinds {
			s.Count += int64(w.Count(op, k))
			s.Total += w.Total(op, k)
		}
		return s
	}
	all := []relpath.Kind{relpath.KindOther, relpath.KindRel, relpath.KindWAL, relpath.KindLocal}
	out := []WaitStat{}
	for _, x := range []struct {
		name  string
		op    fusefs.Op
		kinds []relpath.Kind
	}{
		{WaitGetPage, fusefs.OpGetPage, []relpath.Kind{relpath.KindRel}},
		{WaitFsync, fusefs.OpFsync, all},
		{WaitFUSERead, fusefs.OpRead, []relpath.Kind{relpath.KindRel}},
		{WaitFUSEWrite, fusefs.OpWrite, []relpath.Kind{relpath.KindRel}},
		{WaitWALWrite, fusefs.OpWrite, []relpath.Kind{relpath.KindWAL}},
	} {
		s := sum(x.op, x.kinds...)
		s.Name = x.name
		out = append(out, s)
	}
	return out
}

func cacheWaits(w *cache.Waits) []WaitStat {
	if w == nil {
		return nil
	}
	var out []WaitStat
	for _, s := range w.Snapshot() {
		out = append(out, WaitStat{Name: s.Name, Count: s.Count, Total: s.Total})
	}
	return out
}

// PrintReport writes r as a table: one line per wait kind with its count,
// total and mean, the largest total first.
func PrintReport(w io.Writer, r Report) error {
	fmt.Fprintf(w, "state %s, term %d, E %s, W %s, durable %s, restarts %d, cold start %s, uptime %s\n",
		r.State, r.Term, r.DurableEnd, r.W, r.Durable, r.Restarts, r.ColdStart, r.Uptime)
	if p := r.Progress; p != nil {
		fmt.Fprintf(w, "%s: %s, for %s (last progress %s ago)\n", p.Verb(), p, p.Elapsed, p.Idle)
	}
	if tot := r.CacheHits + r.CacheMisses; tot > 0 {
		fmt.Fprintf(w, "cache %s: %d hits, %d misses (%.1f%% hits)\n", r.Strategy, r.CacheHits, r.CacheMisses, 100*float64(r.CacheHits)/float64(tot))
	} else if r.Strategy == StrategySharedBuffers {
		// No tier behind shared_buffers: its misses are the getpage line.
		fmt.Fprintf(w, "cache %s: no LFC; shared_buffers misses read from the pageserver (getpage)\n", r.Strategy)
	} else {
		fmt.Fprintf(w, "cache %s: no reads yet\n", r.Strategy)
	}
	if p := r.Prewarm; p != nil {
		switch {
		case p.State == "off":
			fmt.Fprintln(w, "prewarm off")
		case p.State == "none":
			fmt.Fprintln(w, "prewarm: no page list was saved for this timeline")
		case p.State == "autoprewarm":
			fmt.Fprintln(w, "prewarm: Postgres' autoprewarm (pg_prewarm) loads shared_buffers from autoprewarm.blocks after a start")
		case p.State == "pending":
			fmt.Fprintln(w, "prewarm pending: starts once Postgres accepts connections")
		case p.State == "failed" && p.Total == 0:
			fmt.Fprintf(w, "prewarm failed, the LFC started cold: %s\n", p.Error)
		default:
			fmt.Fprintf(w, "prewarm %s: %d of %d pages loaded (%d already cached, %d skipped) in %s from %s", p.State, p.Loaded, p.Total, p.Cached, p.Skipped, p.Took, p.List)
			if p.Error != "" {
				fmt.Fprintf(w, ": %s", p.Error)
			}
			fmt.Fprintln(w)
		}
	}
	if l := r.LFC; l != nil {
		fmt.Fprintf(w, "lfc: %s of %s in use (budget %s)", mib(l.UsedBytes), mib(l.CapacityBytes), mib(l.BudgetBytes))
		if l.Advisor != "" {
			fmt.Fprintf(w, "; advisor %s", l.Advisor)
		}
		fmt.Fprintln(w)
	}
	if rs := r.RedoStore; rs != nil {
		fmt.Fprintf(w, "redo store (%s): %d pages, %d pinned, %d evicted, %d re-read at the WAL position\n", r.PageSource, rs.Pages, rs.Pinned, rs.Evicted, rs.Refetches)
	}
	if ra := r.ReadAhead; ra.Batches > 0 {
		fmt.Fprintf(w, "read-ahead: %d pages fetched in %d batches, %d used, %d dropped unread\n", ra.Fetched, ra.Batches, ra.Used, ra.Dropped)
	}
	if lk := r.WALLookups; lk.Walked+lk.Unchanged > 0 {
		fmt.Fprintf(w, "W lookups: %d walked new WAL, %d found pg_wal unchanged\n", lk.Walked, lk.Unchanged)
	}
	ws := append([]WaitStat(nil), r.Waits...)
	sort.SliceStable(ws, func(i, j int) bool { return ws[i].Total > ws[j].Total })
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "WAIT\tCOUNT\tTOTAL\tMEAN\t")
	for _, s := range ws {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t\n", s.Name, s.Count, s.Total.Round(time.Microsecond), s.Mean().Round(100*time.Nanosecond))
	}
	return tw.Flush()
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// fsCollector exports the current mount's counters (the mount changes on
// every restart of Postgres; the counters restart with it).
type fsCollector struct{ a *Agent }

var descLookups = prometheus.NewDesc("strata_compute_wal_lookups_total",
	"W lookups (page writes, fsyncs, file and folder changes, the wait report), pg_wal out of the mount: walked (read the WAL written since the last walk) or unchanged (nothing changed in pg_wal since, by inotify; no file read).",
	[]string{"result"}, nil)

func (c fsCollector) Describe(ch chan<- *prometheus.Desc) {
	(&fusefs.Waits{}).Collector().Describe(ch)
	ch <- descLookups
}

func (c fsCollector) Collect(ch chan<- prometheus.Metric) {
	if f := c.a.currentFS(); f != nil {
		f.Waits().Collector().Collect(ch)
		walks, unwalked := f.WAL().FollowStats()
		ch <- prometheus.MustNewConstMetric(descLookups, prometheus.CounterValue, float64(walks), "walked")
		ch <- prometheus.MustNewConstMetric(descLookups, prometheus.CounterValue, float64(unwalked), "unchanged")
	}
}

// Handler serves /metrics (Prometheus), /waits (the Report as JSON),
// /healthz (200 with "running" while Postgres serves, else 503 with the
// agent's state) and Go's profiler (/debug/pprof/).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	metrics.HandleProfiler(mux)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		state := a.state
		a.mu.Unlock()
		if state != "running" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, state)
	})
	mux.Handle("/metrics", promhttp.HandlerFor(a.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/waits", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(a.FreshReport(r.Context()))
	})
	return mux
}
