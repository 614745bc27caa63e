// Package runner executes a strata bench matrix: it starts and switches
// targets, applies each configuration's settings (restarting when needed),
// loads a template database once per target and size and clones it before
// every run, drives TPROC-C or pgbench, collects everything around the timed
// window, checks TPC-C consistency, and saves each run in the results
// database as soon as it ends. Ctrl-C (context cancellation) stops the run
// in progress, keeps what it measured, and stops every managed server.
package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/bench/collect"
	"github.com/stratadb/strata/core/bench/matrix"
	"github.com/stratadb/strata/core/bench/pgbench"
	"github.com/stratadb/strata/core/bench/report"
	"github.com/stratadb/strata/core/bench/results"
	"github.com/stratadb/strata/core/bench/target"
	"github.com/stratadb/strata/core/bench/tpcc"
)

// RunDB is the database each run uses, cloned from the template.
const RunDB = "strata_bench_run"

// MonitorDB is the database the collectors' sessions use, so that their
// transactions stay out of TPM.
const MonitorDB = "strata_bench_monitor"

// CPUNoisePct is the share of the machine that other processes, or the
// hypervisor's steal, may take before a run is flagged as noisy.
const CPUNoisePct = 10.0

// Options shape a matrix execution.
type Options struct {
	Matrix   *matrix.Matrix
	Store    *results.Store
	Registry target.Registry
	Log      zerolog.Logger
	// Progress receives progress bars and the live summary line (nil: none).
	Progress io.Writer
	GitRev   string
	Machine  map[string]string
	// Seed makes the workload's random draws repeatable.
	Seed uint64
}

// Runner executes one matrix. It is used from one goroutine.
type Runner struct {
	opts    Options
	targets map[string]target.Target
	active  target.Target
	loaded  map[string]bool
}

// Execute runs the whole schedule and returns the saved runs. When ctx is
// cancelled it returns the runs saved so far (the one in progress
// included, marked interrupted) and ctx's error.
func Execute(ctx context.Context, opts Options) ([]*results.Run, error) {
	if opts.Registry == nil {
		opts.Registry = target.DefaultRegistry()
	}
	if opts.Machine == nil {
		opts.Machine = MachineInfo()
	}
	r := &Runner{opts: opts, targets: map[string]target.Target{}, loaded: map[string]bool{}}
	defer r.closeAll()
	// Fail fast on targets that cannot exist (e.g. kind strata).
	for _, tc := range opts.Matrix.Targets {
		t, err := opts.Registry.New(tc, opts.Log)
		if err != nil {
			return nil, err
		}
		r.targets[tc.Name] = t
	}
	sched := opts.Matrix.Schedule()
	// A target's state (a whole strata cluster: tens of GB after a few
	// TPROC-C runs) is removed after its last run, not at the end: a
	// matrix of several targets would otherwise fill the disk.
	lastUse := map[string]int{}
	for i, run := range sched {
		lastUse[run.Target.Name] = i
	}
	var out []*results.Run
	for i, run := range sched {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		opts.Log.Info().Int("run", i+1).Int("of", len(sched)).Str("config", run.Label()).Int("repeat", run.Repeat).Msg("run starting")
		res, err := r.one(ctx, i, len(sched), run)
		if res != nil {
			if serr := opts.Store.Save(context.WithoutCancel(ctx), res); serr != nil {
				return out, serr
			}
			out = append(out, res)
			r.printLine(fmt.Sprintf("[%d/%d] %s rep %d: %s\n", i+1, len(sched), run.Label(), run.Repeat, Headline(res)))
		}
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			opts.Log.Error().Err(err).Str("config", run.Label()).Msg("run failed")
		}
		if lastUse[run.Target.Name] == i {
			r.retire(run.Target.Name)
		}
	}
	return out, nil
}

// retire closes a target that no later run uses (Close removes its
// state); closeAll skips it.
func (r *Runner) retire(name string) {
	t, ok := r.targets[name]
	if !ok {
		return
	}
	if r.active == t {
		r.active = nil
	}
	delete(r.targets, name)
	if err := t.Close(); err != nil {
		r.opts.Log.Warn().Err(err).Str("target", name).Msg("close target")
	}
	r.opts.Log.Info().Str("target", name).Msg("target done: its state removed")
}

// Headline renders a run's main figures on one line.
func Headline(r *results.Run) string {
	s := ""
	if r.Workload == "tpcc" {
		s = fmt.Sprintf("NOPM %.0f TPM %.0f p95(NO) %.2f ms", r.NOPM, r.TPM, r.P95)
		if v, ok := r.Metrics["wal_bytes_per_new_order"]; ok {
			s += fmt.Sprintf(" WAL/NO %.1f KB", v/1024)
		}
	} else {
		s = fmt.Sprintf("TPS %.0f p95 %.2f ms", r.TPM/60, r.P95)
	}
	if v, ok := r.Metrics["fpi_bytes_share"]; ok {
		s += fmt.Sprintf(" FPI %.0f%%", 100*v)
	}
	d := report.Derived(r)
	if v, ok := d[report.GetPageP99]; ok {
		s += fmt.Sprintf(" GetPage-p99 %.2f ms", v)
	}
	if v, ok := d[report.DeltasPerGetPage]; ok {
		s += fmt.Sprintf(" deltas/GetPage %.2f", v)
	}
	if v, ok := d[report.PageserverCPUPct]; ok {
		s += fmt.Sprintf(" pageserver-CPU %.0f%%", v)
	}
	var parts []string
	for _, p := range report.CPUParts {
		if v, ok := r.Metrics["cpu_"+p+"_pct"]; ok {
			parts = append(parts, fmt.Sprintf("%s %.0f%%", p, v))
		}
	}
	if len(parts) > 0 {
		s += " CPU " + strings.Join(parts, " ")
	}
	s += fmt.Sprintf(" other-CPU %.0f%%", r.Metrics["cpu_other_pct"])
	if v := r.Metrics["cpu_steal_pct"]; v >= 1 {
		s += fmt.Sprintf(" steal %.0f%%", v)
	}
	if report.Noisy(r, CPUNoisePct) {
		s += fmt.Sprintf(" [%s, noisy]", r.Status)
	} else {
		s += fmt.Sprintf(" [%s]", r.Status)
	}
	return s
}

func (r *Runner) printLine(s string) {
	if r.opts.Progress != nil {
		fmt.Fprint(r.opts.Progress, "\r\033[K"+s)
	}
}

func (r *Runner) closeAll() {
	for name, t := range r.targets {
		if err := t.Close(); err != nil {
			r.opts.Log.Warn().Err(err).Str("target", name).Msg("close target")
		}
	}
}

func (r *Runner) activate(ctx context.Context, t target.Target) error {
	if r.active == t {
		return nil
	}
	if r.active != nil {
		if err := r.active.Stop(ctx); err != nil {
			return err
		}
	}
	r.active = t
	return t.Start(ctx)
}

func templateName(run matrix.Run) string {
	if run.Workload == "pgbench" {
		return fmt.Sprintf("strata_bench_pgbench_s%d", run.Warehouses)
	}
	return fmt.Sprintf("strata_bench_tpcc_w%d", run.Warehouses)
}

func (r *Runner) ensureTemplate(ctx context.Context, t target.Target, run matrix.Run) error {
	tmpl := templateName(run)
	key := t.Name() + "/" + tmpl
	if r.loaded[key] {
		return nil
	}
	base := t.URL()
	if run.Workload == "pgbench" {
		ok, err := pgbenchTemplateExists(ctx, base, tmpl, run.Warehouses)
		if err != nil {
			return err
		}
		if !ok {
			r.opts.Log.Info().Str("target", t.Name()).Int("scale", run.Warehouses).Msg("pgbench init")
			admin, err := tpcc.Connect(ctx, base, "")
			if err != nil {
				return err
			}
			err = tpcc.DropDatabase(ctx, admin, tmpl)
			if err == nil {
				_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{tmpl}.Sanitize())
			}
			admin.Close(context.Background())
			if err != nil {
				return err
			}
			if err := pgbench.Init(ctx, pgbench.Options{BinDir: binDir(t), URL: urlWithDB(base, tmpl), Scale: run.Warehouses}); err != nil {
				return err
			}
			if err := execOn(ctx, base, tmpl, "VACUUM (ANALYZE, FREEZE)"); err != nil {
				return err
			}
		}
	} else {
		ok, err := tpcc.DatabaseExists(ctx, base, tmpl, run.Warehouses)
		if err != nil {
			return err
		}
		if !ok {
			workers := r.opts.Matrix.LoadWorkers
			if workers == 0 {
				workers = max(2, runtime.NumCPU())
			}
			err := tpcc.Load(ctx, tpcc.LoadOptions{Base: base, DB: tmpl, Warehouses: run.Warehouses,
				Workers: workers, Progress: r.opts.Progress, Log: r.opts.Log, Seed: r.opts.Seed + 1})
			if err != nil {
				return err
			}
		}
	}
	r.loaded[key] = true
	return nil
}

// urlWithDB returns base pointed at db, as a libpq connection string.
func urlWithDB(base, db string) string {
	cfg, err := tpcc.ConnConfig(base, db)
	if err != nil {
		return base
	}
	s := fmt.Sprintf("host=%s port=%d user=%s dbname=%s", cfg.Host, cfg.Port, cfg.User, db)
	if cfg.Password != "" {
		s += " password=" + cfg.Password
	}
	if cfg.TLSConfig == nil {
		s += " sslmode=disable"
	}
	return s
}

func binDir(t target.Target) string {
	if w, ok := t.(target.WALSource); ok {
		return w.BinDir()
	}
	return pgbench.DefaultBinDir
}

func execOn(ctx context.Context, base, db, q string) error {
	c, err := tpcc.Connect(ctx, base, db)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	_, err = c.Exec(ctx, q)
	return err
}

// prewarmPasses bounds the pg_prewarm passes of prewarm.
const prewarmPasses = 5

// prewarmed is what prewarm did: the relations' blocks, the share of them
// in shared_buffers at the end (-1: unknown, pg_buffercache missing) and
// the passes it took.
type prewarmed struct {
	took     time.Duration
	blocks   int64
	resident float64
	passes   int
}

// prewarm loads every table, index and TOAST table of db into
// shared_buffers with pg_prewarm.
//
// One pass is not always enough. Right after a target loads the template,
// shared_buffers holds the template's pages with high usage counts; the
// clone's pages come in at usage 1 and the clock sweep evicts them first,
// so one pass left about a third of a 4-warehouse clone out of a 512 MB
// shared_buffers, and the first run of every target read those pages in
// its window (from the page cache on stock, from the pageserver on
// strata), while later runs, whose earlier clone was dropped with its
// buffers, read none. So passes repeat while they still bring pages in
// (pg_buffercache counts the clone's resident blocks), up to
// prewarmPasses: each one raises the clone's usage counts and wears down
// the others'.
func prewarm(ctx context.Context, base, db string) (prewarmed, error) {
	start := time.Now()
	out := prewarmed{resident: -1}
	c, err := tpcc.Connect(ctx, base, db)
	if err != nil {
		return out, err
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_prewarm"); err != nil {
		return out, fmt.Errorf("prewarm: the pg_prewarm extension (PostgreSQL contrib) is needed: %w", err)
	}
	const rels = `FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'i', 't', 'm') AND c.relpersistence = 'p'
		AND n.nspname NOT IN ('pg_catalog', 'information_schema')`
	count := func() (int64, error) { return -1, nil }
	if _, err := c.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_buffercache"); err == nil {
		count = func() (int64, error) {
			var n int64
			err := c.QueryRow(ctx, `SELECT count(*) FROM pg_buffercache b
				WHERE b.reldatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
				AND b.relforknumber = 0
				AND b.relfilenode IN (SELECT pg_relation_filenode(c.oid) `+rels+`)`).Scan(&n)
			return n, err
		}
	}
	var resident int64 = -1
	for out.passes < prewarmPasses {
		if err := c.QueryRow(ctx, `SELECT coalesce(sum(pg_prewarm(c.oid)), 0) `+rels).Scan(&out.blocks); err != nil {
			return out, fmt.Errorf("prewarm: %w", err)
		}
		out.passes++
		n, err := count()
		if err != nil {
			return out, fmt.Errorf("prewarm: count the resident blocks: %w", err)
		}
		// Done when residency is unknown, complete, or no longer growing
		// (more than 1% of the blocks): the rest does not fit.
		if n < 0 || n >= out.blocks || n-resident <= out.blocks/100 {
			resident = n
			break
		}
		resident = n
	}
	if resident >= 0 && out.blocks > 0 {
		out.resident = 100 * float64(resident) / float64(out.blocks)
	}
	out.took = time.Since(start)
	return out, nil
}

func ensureDatabase(ctx context.Context, base, db string) error {
	admin, err := tpcc.Connect(ctx, base, "")
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", db).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{db}.Sanitize())
	return err
}

func pgbenchTemplateExists(ctx context.Context, base, db string, scale int) (bool, error) {
	admin, err := tpcc.Connect(ctx, base, "")
	if err != nil {
		return false, err
	}
	defer admin.Close(context.Background())
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", db).Scan(&n); err != nil || n == 0 {
		return false, err
	}
	c, err := tpcc.Connect(ctx, base, db)
	if err != nil {
		return false, err
	}
	defer c.Close(context.Background())
	var branches int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM pgbench_branches").Scan(&branches); err != nil {
		return false, nil
	}
	return branches == scale, nil
}

// one executes a run. It returns the run to save (also for failures after
// the window began) and the error.
func (r *Runner) one(ctx context.Context, idx, total int, run matrix.Run) (*results.Run, error) {
	m := r.opts.Matrix
	t := r.targets[run.Target.Name]
	res := &results.Run{Matrix: m.Name, Label: run.Label(), Series: run.Series(), Target: t.Name(),
		TargetKind: t.Kind(), Workload: run.Workload, Repeat: run.Repeat, VUs: run.VUs,
		Warehouses: run.Warehouses, Settings: map[string]string{}, Machine: map[string]string{},
		GitRev: r.opts.GitRev, StartedAt: time.Now(), Status: "failed",
		Metrics: map[string]float64{}, Waits: map[string]int64{}, TimeSeries: map[string][]results.Point{}}
	for k, v := range run.Target.Settings {
		res.Settings[k] = v
	}
	// The target's strata config keys, marked so that they do not read as
	// Postgres settings.
	for k, v := range run.Target.Config {
		res.Settings[results.StrataConfigPrefix+k] = v
	}
	for k, v := range run.Settings {
		res.Settings[k] = v
	}
	for k, v := range r.opts.Machine {
		res.Machine[k] = v
	}
	fail := func(err error) (*results.Run, error) {
		res.Notes = append(res.Notes, "error: "+err.Error())
		return res, err
	}
	if err := r.activate(ctx, t); err != nil {
		return fail(err)
	}
	if err := r.ensureTemplate(ctx, t, run); err != nil {
		return fail(err)
	}
	restarted, err := t.Apply(ctx, run.Settings)
	if err != nil {
		return fail(err)
	}
	if restarted {
		res.Notes = append(res.Notes, "restarted to apply settings")
	}
	base := t.URL()
	if err := tpcc.Clone(ctx, base, templateName(run), RunDB, func(holders string) {
		r.opts.Log.Info().Str("template", templateName(run)).Str("sessions", holders).Msg("the template has sessions (autoprewarm after a start?): waiting for them to leave before the clone")
	}); err != nil {
		return fail(err)
	}
	if err := ensureDatabase(ctx, base, MonitorDB); err != nil {
		return fail(err)
	}
	if v, err := serverVersion(ctx, base); err == nil {
		res.Machine["server_version"] = v
	}
	if max := m.SettleMax(); max > 0 {
		took, quiet, err := r.settle(ctx, t, max, idx, total, run)
		if err != nil {
			return nil, err
		}
		res.Metrics["settle_seconds"] = took.Seconds()
		if !quiet {
			res.Notes = append(res.Notes, fmt.Sprintf("target not quiet after %s of settling", max))
		}
	}
	if m.Prewarm {
		r.printLine(fmt.Sprintf("[%d/%d] %s rep %d  prewarming", idx+1, total, run.Label(), run.Repeat))
		pw, err := prewarm(ctx, base, RunDB)
		if err != nil {
			return fail(err)
		}
		res.Metrics["prewarm_seconds"] = pw.took.Seconds()
		res.Metrics["prewarm_blocks"] = float64(pw.blocks)
		res.Metrics["prewarm_passes"] = float64(pw.passes)
		if pw.resident >= 0 {
			res.Metrics["prewarm_resident_pct"] = pw.resident
		}
	}

	var coll *collect.Collector
	var cres *collect.Result
	var collErr error
	collOpts := collect.Options{URL: base, DB: RunDB, MonitorDB: MonitorDB, NoSamplers: run.NoSamplers, Target: who(t),
		MetricsURL: t.MetricsURL(), Log: r.opts.Log}
	if src, ok := t.(target.MetricsSources); ok {
		collOpts.MetricsURL, collOpts.MetricsURLs = "", src.MetricsURLs()
	}
	// The live line follows the phases: ramp-up, the checkpoint before the
	// window (seconds on strata, where every dirty buffer goes through
	// FUSE), then the window counted from its real start.
	var ckptStart, winStart atomic.Int64
	onWindow := func() {
		winStart.Store(time.Now().UnixNano())
		coll, collErr = collect.Start(ctx, collOpts)
	}
	onWindowEnd := func() {
		if coll != nil {
			cres, collErr = coll.Stop(context.WithoutCancel(ctx))
		}
	}
	beforeWindow := func(ctx context.Context) error {
		if !m.CheckpointBeforeWindow {
			return nil
		}
		t0 := time.Now()
		ckptStart.Store(t0.UnixNano())
		r.printLine(fmt.Sprintf("[%d/%d] %s rep %d  checkpoint before the window", idx+1, total, run.Label(), run.Repeat))
		err := execOn(ctx, base, "", "CHECKPOINT")
		res.Metrics["checkpoint_before_window_seconds"] = time.Since(t0).Seconds()
		return err
	}
	start := time.Now()
	live := func(s string) {
		r.printLine(fmt.Sprintf("[%d/%d] %s rep %d  %s  %s", idx+1, total, run.Label(), run.Repeat,
			phase(time.Now(), start, ckptStart.Load(), winStart.Load(), run.Rampup, run.Duration), s))
	}

	switch run.Workload {
	case "tpcc":
		tr, err := tpcc.Run(ctx, tpcc.Options{Base: base, DB: RunDB, ExcludeDB: MonitorDB, Warehouses: run.Warehouses, VUs: run.VUs,
			Rampup: run.Rampup, Duration: run.Duration, Seed: r.opts.Seed + uint64(idx)*7 + 1, Log: r.opts.Log,
			Interval: time.Second, BeforeWindow: beforeWindow, OnWindow: onWindow, OnWindowEnd: onWindowEnd,
			Tick: func(l tpcc.Live) {
				live(fmt.Sprintf("NOPM %.0f  tx/s %.0f  errors %d", l.NOPM, l.TxPerSec, l.Errors))
			}})
		if err != nil {
			if coll != nil && cres == nil {
				_, _ = coll.Stop(context.WithoutCancel(ctx))
			}
			if errors.Is(err, tpcc.ErrInterrupted) {
				return nil, ctx.Err()
			}
			return fail(err)
		}
		fillTPCC(res, tr)
		if m.VerifyEnabled() && !tr.Interrupted {
			vctx := context.WithoutCancel(ctx)
			if c, err := tpcc.Connect(vctx, base, RunDB); err == nil {
				checks, ok, err := tpcc.Verify(vctx, c)
				c.Close(vctx)
				var bad int64
				for _, ch := range checks {
					bad += ch.Violations
					if ch.Violations > 0 {
						res.Notes = append(res.Notes, fmt.Sprintf("consistency check %s: %d violations", ch.Name, ch.Violations))
					}
				}
				res.Metrics["consistency_violations"] = float64(bad)
				if err != nil {
					res.Notes = append(res.Notes, "consistency: "+err.Error())
				} else if ok {
					res.Notes = append(res.Notes, "consistency checks passed")
				}
			}
		}
	case "pgbench":
		pr, err := pgbench.Run(ctx, pgbench.Options{BinDir: binDir(t), URL: urlWithDB(base, RunDB),
			Clients: run.VUs, Threads: run.Pgbench.Threads, Rampup: run.Rampup, Duration: run.Duration,
			Mode: run.Pgbench.Mode, Builtin: run.Pgbench.Builtin, Log: r.opts.Log,
			BeforeWindow: beforeWindow, OnWindow: onWindow, OnWindowEnd: onWindowEnd,
			Tick: func(l string) { live(strings.TrimPrefix(l, "progress: ")) }})
		if err != nil {
			if coll != nil && cres == nil {
				_, _ = coll.Stop(context.WithoutCancel(ctx))
			}
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return fail(err)
		}
		fillPgbench(res, pr)
		// pgbench's length is fixed when it starts (ramp-up plus window), so
		// a slow checkpoint before the window shortens the window.
		ckpt, ok := res.Metrics["checkpoint_before_window_seconds"]
		if want := run.Duration.Seconds(); ok && !pr.Interrupted && res.WindowSec < 0.9*want {
			res.Notes = append(res.Notes, fmt.Sprintf("the window was %.0f s of %.0f s: the checkpoint before it took %.0f s of pgbench's fixed run",
				res.WindowSec, want, ckpt))
		}
	}
	r.printLine("")
	if collErr != nil {
		res.Notes = append(res.Notes, "collector: "+collErr.Error())
	}
	if cres != nil {
		fillCollected(ctx, res, cres, t)
	}
	return res, nil
}

// phase names where a run is at now: ramp-up (from start), the checkpoint
// before the window (from ckpt, Unix nanoseconds, 0 before it) or the
// window (from win, 0 before it), with the seconds of that phase.
func phase(now, start time.Time, ckpt, win int64, ramp, window time.Duration) string {
	switch {
	case win != 0:
		el := now.Sub(time.Unix(0, win))
		return fmt.Sprintf("window %3.0f/%.0fs", math.Min(el.Seconds(), window.Seconds()), window.Seconds())
	case ckpt != 0:
		return fmt.Sprintf("checkpoint %2.0fs", now.Sub(time.Unix(0, ckpt)).Seconds())
	}
	return fmt.Sprintf("ramp-up %2.0f/%.0fs", math.Min(now.Sub(start).Seconds(), ramp.Seconds()), ramp.Seconds())
}

func serverVersion(ctx context.Context, base string) (string, error) {
	c, err := tpcc.Connect(ctx, base, "")
	if err != nil {
		return "", err
	}
	defer c.Close(context.Background())
	var v string
	err = c.QueryRow(ctx, "SHOW server_version").Scan(&v)
	return v, err
}

func ms(us int64) float64 { return float64(us) / 1000 }

func latency(tx string, h *hdrhistogram.Histogram, count, errs int64) results.Latency {
	return results.Latency{Tx: tx, Count: count, Errors: errs,
		P50: ms(h.ValueAtQuantile(50)), P95: ms(h.ValueAtQuantile(95)), P99: ms(h.ValueAtQuantile(99)),
		Max: ms(h.Max()), Mean: h.Mean() / 1000}
}

func fillTPCC(res *results.Run, tr *tpcc.Result) {
	res.Status = "ok"
	if tr.Interrupted {
		res.Status = "interrupted"
	}
	res.StartedAt = tr.WindowStart
	res.WindowSec = tr.WindowEnd.Sub(tr.WindowStart).Seconds()
	res.NOPM, res.TPM = tr.NOPM, tr.TPM
	res.P95 = ms(tr.Latency["new_order"].ValueAtQuantile(95))
	var errs int64
	for _, name := range tpcc.TxNames {
		res.Latency = append(res.Latency, latency(name, tr.Latency[name], tr.Count[name], tr.Errors[name]))
		errs += tr.Errors[name]
	}
	res.Metrics["new_orders"] = float64(tr.NewOrders)
	res.Metrics["xacts"] = float64(tr.Xacts)
	res.Metrics["rollbacks"] = float64(tr.Rollbacks)
	res.Metrics["errors"] = float64(errs)
	for _, p := range tr.NOPMSeries {
		res.TimeSeries["nopm"] = append(res.TimeSeries["nopm"], results.Point{T: p.T, V: p.V})
	}
}

func fillPgbench(res *results.Run, pr *pgbench.Result) {
	res.Status = "ok"
	if pr.Interrupted {
		res.Status = "interrupted"
	}
	res.StartedAt = pr.WindowStart
	res.WindowSec = pr.WindowEnd.Sub(pr.WindowStart).Seconds()
	res.TPM = pr.TPS * 60
	res.P95 = ms(pr.Latency.ValueAtQuantile(95))
	res.Latency = append(res.Latency, latency("pgbench", pr.Latency, pr.Transactions, pr.Failed))
	res.Metrics["xacts"] = float64(pr.Transactions)
	res.Metrics["errors"] = float64(pr.Failed)
	for _, p := range pr.TPSSeries {
		res.TimeSeries["tps"] = append(res.TimeSeries["tps"], results.Point{T: p[0], V: p[1]})
	}
}

func fillCollected(ctx context.Context, res *results.Run, c *collect.Result, t target.Target) {
	for k, v := range c.Stats {
		res.Metrics["pg."+k] = v
	}
	for k, v := range c.Metrics {
		res.Metrics["strata."+k] = v
	}
	res.Waits = c.Waits
	res.Metrics["wait_ticks"] = float64(c.WaitTicks)
	walBytes := c.Stats["wal.lsn_bytes"]
	res.Metrics["wal_bytes"] = walBytes
	if n := res.Metrics["new_orders"]; n > 0 {
		res.Metrics["wal_bytes_per_new_order"] = walBytes / n
		res.Metrics["wal_records_per_new_order"] = c.Stats["wal.wal_records"] / n
		res.Metrics["wal_fpi_per_new_order"] = c.Stats["wal.wal_fpi"] / n
	}
	if n := res.Metrics["xacts"]; n > 0 {
		res.Metrics["wal_bytes_per_xact"] = walBytes / n
		res.Metrics["wal_records_per_xact"] = c.Stats["wal.wal_records"] / n
		res.Metrics["wal_fpi_per_xact"] = c.Stats["wal.wal_fpi"] / n
	}
	if rec := c.Stats["wal.wal_records"]; rec > 0 {
		res.Metrics["fpi_per_record"] = c.Stats["wal.wal_fpi"] / rec
	}
	if hit, read := c.Stats["db.blks_hit"], c.Stats["db.blks_read"]; hit+read > 0 {
		res.Metrics["cache_hit_ratio"] = hit / (hit + read)
	}
	if w, ok := t.(target.WALSource); ok && c.StartLSN != "" {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		ws, err := collect.WALDump(dctx, w.BinDir(), w.WALDir(), c.StartLSN, c.EndLSN)
		cancel()
		if err != nil {
			res.Notes = append(res.Notes, "pg_waldump: "+err.Error())
		} else {
			res.Metrics["fpi_bytes"] = float64(ws.FPIBytes)
			res.Metrics["fpi_bytes_share"] = ws.FPIShare()
			res.Metrics["waldump_bytes"] = float64(ws.TotalBytes)
		}
	}
	if c.Ping != nil && c.Ping.TotalCount() > 0 {
		res.Metrics["ping_p50_ms"] = ms(c.Ping.ValueAtQuantile(50))
		res.Metrics["ping_p95_ms"] = ms(c.Ping.ValueAtQuantile(95))
		res.Metrics["ping_p99_ms"] = ms(c.Ping.ValueAtQuantile(99))
		res.Metrics["ping_max_ms"] = ms(c.Ping.Max())
	}
	res.Metrics["cpu_busy_pct"] = c.CPU.Busy
	res.Metrics["cpu_target_pct"] = c.CPU.Target
	res.Metrics["cpu_driver_pct"] = c.CPU.Driver
	res.Metrics["cpu_other_pct"] = c.CPU.Other
	res.Metrics["cpu_steal_pct"] = c.CPU.Steal
	cpuParts(res, c)
	if c.CPU.Steal > CPUNoisePct {
		res.Notes = append(res.Notes, fmt.Sprintf("cpu steal: the hypervisor gave %.0f%% of the machine's time to other guests; this run's figures are lower than the machine's", c.CPU.Steal))
	}
	if c.CPU.Other > CPUNoisePct {
		var top []string
		for _, p := range c.CPU.TopOther {
			top = append(top, fmt.Sprintf("%s[%d] %.0f%%", p.Comm, p.PID, p.Pct))
		}
		res.Notes = append(res.Notes, fmt.Sprintf("cpu noise: other processes used %.0f%% of the machine (%s)", c.CPU.Other, strings.Join(top, ", ")))
	}
	for _, e := range c.Errors {
		res.Notes = append(res.Notes, "collector: "+e)
	}
}

// MachineInfo describes this machine for the results database.
func MachineInfo() map[string]string {
	m := map[string]string{"cores": fmt.Sprint(runtime.NumCPU()), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH}
	if h, err := os.Hostname(); err == nil {
		m["hostname"] = h
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if i := strings.IndexByte(l, ':'); i >= 0 {
					m["cpu"] = strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		l := strings.SplitN(string(b), "\n", 2)[0]
		m["memory"] = strings.Join(strings.Fields(strings.TrimPrefix(l, "MemTotal:")), " ")
	}
	return m
}

// GitRevision returns the revision of the code being measured: the VCS
// revision stamped into this binary by `go build` (short, with "-dirty" when
// it was built from a modified tree), else `git rev-parse --short HEAD` in
// dir (with "-dirty" for a modified tree, and "-stale" when this binary is
// older than a source file of that checkout: it was not built from what
// the revision names), else "unknown".
func GitRevision(dir string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		rev, dirty := "", false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if rev != "" {
			if len(rev) > 7 {
				rev = rev[:7]
			}
			if dirty {
				rev += "-dirty"
			}
			return rev
		}
	}
	out, err := exec.Command("git", "-C", dir, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "-C", dir, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(strings.TrimSpace(string(st))) > 0 {
		rev += "-dirty"
	}
	if exe, err := os.Executable(); err == nil {
		if fi, err := os.Stat(exe); err == nil {
			if _, _, stale := NewerSource(dir, fi.ModTime()); stale {
				rev += "-stale"
			}
		}
	}
	return rev
}

// NewerSource reports the newest Go source file (or go.mod, go.sum) that
// git tracks in dir's checkout, and whether it changed after built (a
// binary built at built does not hold it). Test files are left out: no
// binary holds them.
func NewerSource(dir string, built time.Time) (path string, mod time.Time, newer bool) {
	top, err := exec.Command("git", "-C", dir, "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", time.Time{}, false
	}
	root := strings.TrimSpace(string(top))
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--", "*.go", "go.mod", "go.sum").Output()
	if err != nil {
		return "", time.Time{}, false
	}
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" || strings.HasSuffix(f, "_test.go") {
			continue
		}
		fi, err := os.Stat(filepath.Join(root, f))
		if err != nil {
			continue // deleted in the work tree
		}
		if fi.ModTime().After(mod) {
			path, mod = f, fi.ModTime()
		}
	}
	return path, mod, mod.After(built)
}

// SortedKeys returns m's keys sorted.
func SortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// cpuParts records the target's CPU by part (cpu_<part>_pct), its
// Postgres processes' CPU by role (cpu_pg_backends_pct,
// cpu_pg_walsenders_pct, cpu_pg_background_pct) and, for the target, each
// part and each role, its CPU per unit of work in core time: ms per
// New-Order (TPROC-C) or us per transaction (pgbench). The per-unit
// figure compares parts across targets whatever their throughput: a
// safekeeper against a pg_receivewal, Postgres on strata against Postgres
// on local disk.
func cpuParts(res *results.Run, c *collect.Result) {
	coreSec := float64(c.CPU.Cores) * c.Duration.Seconds() / 100 // core-seconds per percent of the machine
	perUnit := func(name string, pct float64) {
		if n := res.Metrics["new_orders"]; n > 0 {
			res.Metrics["cpu_"+name+"_ms_per_new_order"] = 1000 * pct * coreSec / n
		} else if n := res.Metrics["xacts"]; n > 0 {
			res.Metrics["cpu_"+name+"_us_per_xact"] = 1e6 * pct * coreSec / n
		}
	}
	perUnit("target", c.CPU.Target)
	for name, pct := range c.CPU.Parts {
		res.Metrics["cpu_"+name+"_pct"] = pct
		perUnit(name, pct)
	}
	for kind, pct := range c.CPU.PGKinds {
		res.Metrics["cpu_pg_"+kind+"_pct"] = pct
		perUnit("pg_"+kind, pct)
	}
}

// who names t's processes on this machine: its PIDs, or else the process
// names of a target known by URL.
func who(t target.Target) collect.Who {
	w := collect.Who{PIDs: t.PIDs()}
	if n, ok := t.(target.ProcessNames); ok && len(w.PIDs) == 0 {
		w.Names = n.ProcessNames()
	}
	if p, ok := t.(target.ProcessParts); ok && len(w.PIDs) > 0 {
		w.Parts = p.ProcessParts()
	}
	return w
}

// settle waits until the target's own processes use less than
// matrix.SettleQuietPct of the machine for two one-second samples in a
// row, at most max. It returns how long it waited and whether the target
// got quiet.
func (r *Runner) settle(ctx context.Context, t target.Target, max time.Duration, idx, total int, run matrix.Run) (time.Duration, bool, error) {
	start := time.Now()
	calm := 0
	for time.Since(start) < max {
		pct, err := collect.TargetCPU(ctx, who(t), time.Second)
		if err != nil {
			return time.Since(start), false, err
		}
		r.printLine(fmt.Sprintf("[%d/%d] %s rep %d  settling %.0fs: target CPU %.1f%% (quiet below %d%%)",
			idx+1, total, run.Label(), run.Repeat, time.Since(start).Seconds(), pct, matrix.SettleQuietPct))
		if pct < matrix.SettleQuietPct {
			calm++
			if calm == 2 {
				r.printLine("")
				r.opts.Log.Info().Str("target", t.Name()).Dur("took", time.Since(start)).Msg("target quiet")
				return time.Since(start), true, nil
			}
		} else {
			calm = 0
		}
	}
	r.printLine("")
	r.opts.Log.Warn().Str("target", t.Name()).Dur("max", max).Msg("target still busy; starting the run anyway")
	return time.Since(start), false, nil
}
