package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/bench/matrix"
	"github.com/stratadb/strata/core/bench/report"
	"github.com/stratadb/strata/core/bench/results"
	"github.com/stratadb/strata/core/bench/runner"
	"github.com/stratadb/strata/core/bench/tpcc"
)

// newBenchCmd is `strata bench`: the benchmark service (TPROC-C and
// pgbench over a YAML matrix, results database, reports).
func newBenchCmd() *cobra.Command {
	var dbPath, outDir string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark any Postgres endpoint: TPROC-C and pgbench matrices, results, reports",
		Long: `strata bench drives stock PostgreSQL or strata with a TPROC-C workload (HammerDB's
schema and transactions, NOPM counted the HammerDB way) or pgbench, over a matrix
read from YAML (configs/bench/*.yaml), records every run with wait events, WAL,
statistics deltas and CPU into a results database, and renders HTML and PNG reports.`,
	}
	cmd.PersistentFlags().StringVar(&dbPath, "db", filepath.Join(".strata", "bench", "results.db"), "results database: a SQLite file, or a postgres:// URL")
	cmd.PersistentFlags().StringVar(&outDir, "out", filepath.Join(".strata", "bench", "reports"), "folder for reports")

	logger := func() zerolog.Logger {
		return zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: time.TimeOnly}).With().Timestamp().Logger()
	}
	openStore := func(ctx context.Context) (*results.Store, error) { return results.Open(ctx, dbPath) }

	writeReport := func(ctx context.Context, name string, runs []*results.Run, p95 float64) (string, error) {
		dir := filepath.Join(outDir, fmt.Sprintf("%s-%s", sanitize(name), time.Now().UTC().Format("20060102-150405")))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		d := report.Aggregate(name, runs, p95, runner.CPUNoisePct)
		f, err := os.Create(filepath.Join(dir, "report.html"))
		if err != nil {
			return "", err
		}
		if err := report.WriteHTML(f, d); err != nil {
			f.Close()
			return "", err
		}
		if err := f.Close(); err != nil {
			return "", err
		}
		if _, err := report.WritePNGs(dir, d); err != nil {
			return "", err
		}
		return filepath.Join(dir, "report.html"), nil
	}

	// run
	var seed uint64
	run := &cobra.Command{
		Use:   "run MATRIX.yaml",
		Short: "Run a matrix, store every run, and write a report (Ctrl-C stops cleanly and keeps what was measured)",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			m, err := matrix.Load(args[0])
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			store, err := openStore(ctx)
			if err != nil {
				return err
			}
			defer store.Close()
			log := logger()
			rev := benchRevision(args[0])
			log.Info().Str("matrix", m.Name).Int("runs", len(m.Schedule())).Str("db", dbPath).Str("git", rev).Msg("bench starting")
			if strings.HasSuffix(rev, "-stale") {
				log.Warn().Str("git", rev).Msg("this strata binary is older than a source file of the checkout (its revision is not stamped in the binary: go build -buildvcs=true stamps it): the runs measure older code than the revision says; rebuild it (go build -o bin/strata ./cmd/strata)")
			}
			runs, err := runner.Execute(ctx, runner.Options{Matrix: m, Store: store, Log: log, Progress: os.Stderr,
				GitRev: rev, Seed: seed})
			if len(runs) > 0 {
				full := make([]*results.Run, 0, len(runs))
				for _, r := range runs {
					fr, gerr := store.Get(context.WithoutCancel(ctx), r.ID)
					if gerr != nil {
						return gerr
					}
					full = append(full, fr)
				}
				path, rerr := writeReport(context.WithoutCancel(ctx), m.Name, full, float64(m.P95())/float64(time.Millisecond))
				if rerr != nil {
					return errors.Join(err, rerr)
				}
				fmt.Fprintf(c.OutOrStdout(), "%d runs stored in %s; report: %s\n", len(runs), dbPath, path)
				if m.Baseline != "" {
					if perr := report.ComparePaired(c.OutOrStdout(), full, m.Baseline); perr != nil {
						log.Warn().Err(perr).Msg("no paired summary")
					}
				}
			}
			if errors.Is(err, context.Canceled) {
				fmt.Fprintln(c.OutOrStdout(), "interrupted: the runs measured so far are stored")
				return nil
			}
			return err
		},
	}
	run.Flags().Uint64Var(&seed, "seed", 1, "seed of the workload's random draws")

	// ls
	var lsMatrix string
	var lsLimit int
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List stored runs",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			store, err := openStore(c.Context())
			if err != nil {
				return err
			}
			defer store.Close()
			runs, err := store.List(c.Context(), results.Filter{Matrix: lsMatrix, Limit: lsLimit})
			if err != nil {
				return err
			}
			tw := tabwriter.NewWriter(c.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tSTARTED\tMATRIX\tCONFIGURATION\tREP\tSTATUS\tNOPM\tTPM\tP95 MS\tGIT")
			for _, r := range runs {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%.0f\t%.0f\t%.2f\t%s\n", r.ID, r.StartedAt.Local().Format("2006-01-02 15:04"),
					r.Matrix, r.Label, r.Repeat, r.Status, r.NOPM, r.TPM, r.P95, r.GitRev)
			}
			return tw.Flush()
		},
	}
	ls.Flags().StringVar(&lsMatrix, "matrix", "", "only runs of this matrix")
	ls.Flags().IntVar(&lsLimit, "limit", 0, "only the last N runs")

	// show
	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one run in full",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			id, err := strconv.ParseInt(args[0], 10, 64)
			if err != nil {
				return fmt.Errorf("bench show: %q is not a run id", args[0])
			}
			store, err := openStore(c.Context())
			if err != nil {
				return err
			}
			defer store.Close()
			r, err := store.Get(c.Context(), id)
			if err != nil {
				return err
			}
			return showRun(c, r)
		},
	}

	// compare
	var cmpMatrix string
	var cmpHTML bool
	var cmpBaseline string
	compare := &cobra.Command{
		Use:   "compare [ID...]",
		Short: "Put runs side by side (ids, or --matrix for all runs of a matrix); --html also writes a report",
		RunE: func(c *cobra.Command, args []string) error {
			store, err := openStore(c.Context())
			if err != nil {
				return err
			}
			defer store.Close()
			runs, err := selectRuns(c.Context(), store, args, cmpMatrix)
			if err != nil {
				return err
			}
			if len(runs) == 0 {
				return fmt.Errorf("bench compare: no runs (give ids or --matrix)")
			}
			if err := report.Compare(c.OutOrStdout(), runs); err != nil {
				return err
			}
			if cmpBaseline != "" {
				if err := report.ComparePaired(c.OutOrStdout(), runs, cmpBaseline); err != nil {
					return err
				}
			}
			if cmpHTML {
				name := "compare"
				if cmpMatrix != "" {
					name = cmpMatrix
				}
				path, err := writeReport(c.Context(), name, runs, 20)
				if err != nil {
					return err
				}
				fmt.Fprintf(c.OutOrStdout(), "report: %s\n", path)
			}
			return nil
		},
	}
	compare.Flags().StringVar(&cmpMatrix, "matrix", "", "compare all runs of this matrix")
	compare.Flags().BoolVar(&cmpHTML, "html", false, "also write an HTML + PNG report under --out")
	compare.Flags().StringVar(&cmpBaseline, "baseline", "", "also pair each run with this target's run of the same matrix, configuration and repeat, and summarize the throughput ratios")

	// report
	var repMatrix string
	var repP95 time.Duration
	rep := &cobra.Command{
		Use:   "report [ID...]",
		Short: "Write an HTML + PNG report of stored runs (ids, or --matrix)",
		RunE: func(c *cobra.Command, args []string) error {
			store, err := openStore(c.Context())
			if err != nil {
				return err
			}
			defer store.Close()
			runs, err := selectRuns(c.Context(), store, args, repMatrix)
			if err != nil {
				return err
			}
			if len(runs) == 0 {
				return fmt.Errorf("bench report: no runs (give ids or --matrix)")
			}
			name := repMatrix
			if name == "" {
				name = "runs"
			}
			path, err := writeReport(c.Context(), name, runs, float64(repP95)/float64(time.Millisecond))
			if err != nil {
				return err
			}
			fmt.Fprintf(c.OutOrStdout(), "report: %s\n", path)
			return nil
		},
	}
	rep.Flags().StringVar(&repMatrix, "matrix", "", "report all runs of this matrix")
	rep.Flags().DurationVar(&repP95, "p95-limit", 20*time.Millisecond, "latency rule: configurations count only with p95 at most this")

	// load
	var loadURL, loadDB string
	var loadWH, loadWorkers int
	var loadCheck bool
	load := &cobra.Command{
		Use:   "load",
		Short: "Load a TPROC-C database into an existing server (or check one with --check)",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(c.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			if loadURL == "" {
				return fmt.Errorf("bench load: --url is required")
			}
			if !loadCheck {
				if err := tpcc.Load(ctx, tpcc.LoadOptions{Base: loadURL, DB: loadDB, Warehouses: loadWH,
					Workers: loadWorkers, Progress: os.Stderr, Log: logger(), Seed: 1}); err != nil {
					return err
				}
			}
			conn, err := tpcc.Connect(ctx, loadURL, loadDB)
			if err != nil {
				return err
			}
			defer conn.Close(context.Background())
			checks, ok, err := tpcc.Verify(ctx, conn)
			for _, ch := range checks {
				fmt.Fprintf(c.OutOrStdout(), "consistency %-55s violations %d\n", ch.Name, ch.Violations)
			}
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("bench load: consistency checks failed")
			}
			return nil
		},
	}
	load.Flags().StringVar(&loadURL, "url", "", "server connection string (its database is used for CREATE DATABASE)")
	load.Flags().StringVar(&loadDB, "database", "tpcc", "database to create (dropped first)")
	load.Flags().IntVar(&loadWH, "warehouses", 1, "warehouses")
	load.Flags().IntVar(&loadWorkers, "workers", 2, "parallel loading connections")
	load.Flags().BoolVar(&loadCheck, "check", false, "only run the TPC-C consistency checks on --database")

	cmd.AddCommand(run, ls, show, compare, rep, load)
	return cmd
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == ' ' || r == os.PathSeparator {
			return '_'
		}
		return r
	}, s)
}

func selectRuns(ctx context.Context, store *results.Store, args []string, matrixName string) ([]*results.Run, error) {
	var ids []int64
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bench: %q is not a run id", a)
		}
		ids = append(ids, id)
	}
	if matrixName != "" {
		list, err := store.List(ctx, results.Filter{Matrix: matrixName})
		if err != nil {
			return nil, err
		}
		for _, r := range list {
			ids = append(ids, r.ID)
		}
	}
	return store.GetMany(ctx, ids)
}

func showRun(c *cobra.Command, r *results.Run) error {
	w := c.OutOrStdout()
	fmt.Fprintf(w, "run %d  %s  repeat %d  [%s]\n", r.ID, r.Label, r.Repeat, r.Status)
	fmt.Fprintf(w, "matrix %s  target %s (%s)  workload %s  started %s  window %.0fs  git %s\n",
		r.Matrix, r.Target, r.TargetKind, r.Workload, r.StartedAt.Local().Format(time.RFC3339), r.WindowSec, r.GitRev)
	fmt.Fprintf(w, "%s\n", runner.Headline(r))
	fmt.Fprintln(w, "\nsettings:")
	for _, k := range runner.SortedKeys(r.Settings) {
		fmt.Fprintf(w, "  %s = %s\n", k, r.Settings[k])
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\ntransaction\tcount\terrors\tp50 ms\tp95 ms\tp99 ms\tmax ms\t")
	for _, l := range r.Latency {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t%.2f\t%.2f\t%.2f\t\n", l.Tx, l.Count, l.Errors, l.P50, l.P95, l.P99, l.Max)
	}
	tw.Flush()
	if ticks := r.Metrics["wait_ticks"]; ticks > 0 {
		fmt.Fprintf(w, "\nwait events (avg sessions over %.0f samples):\n", ticks)
		keys := runner.SortedKeys(r.Waits)
		sort.Slice(keys, func(i, j int) bool { return r.Waits[keys[i]] > r.Waits[keys[j]] })
		for _, k := range keys {
			fmt.Fprintf(w, "  %-32s %6.2f\n", k, float64(r.Waits[k])/ticks)
		}
	}
	fmt.Fprintln(w, "\nmetrics:")
	for _, k := range runner.SortedKeys(r.Metrics) {
		fmt.Fprintf(w, "  %-40s %.6g\n", k, r.Metrics[k])
	}
	fmt.Fprintln(w, "\nmachine:")
	for _, k := range runner.SortedKeys(r.Machine) {
		fmt.Fprintf(w, "  %s = %s\n", k, r.Machine[k])
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w, "\nnotes:")
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  - %s\n", n)
		}
	}
	return nil
}

// benchRevision is the revision of the code under measurement: the binary's
// VCS stamp, else the checkout the working folder is in, else the checkout
// the matrix file is in, else the checkout the strata binary is in (as
// bin/strata after the README's build; symbolic links followed).
func benchRevision(matrixPath string) string {
	exe, err := os.Executable()
	if err != nil {
		exe = ""
	}
	return revisionOf(matrixPath, exe)
}

// revisionOf is benchRevision with the binary's path given.
func revisionOf(matrixPath, exe string) string {
	if rev := runner.GitRevision("."); rev != "unknown" {
		return rev
	}
	if p, err := filepath.EvalSymlinks(matrixPath); err == nil {
		if rev := runner.GitRevision(filepath.Dir(p)); rev != "unknown" {
			return rev
		}
	}
	if exe == "" {
		return "unknown"
	}
	if p, err := filepath.EvalSymlinks(exe); err == nil {
		return runner.GitRevision(filepath.Dir(p))
	}
	return "unknown"
}
