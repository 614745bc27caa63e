package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/metrics"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pluginhost"
	"github.com/stratadb/strata/sdk/pg"
)

// newComputeCmd returns `strata compute`: the compute agent, and `strata
// compute waits`, its wait report.
func newComputeCmd(a *app) *cobra.Command {
	var (
		pageserver, timeline, filesTimeline, mountpoint, scratch, computeID, metricsAddr, replUser string
		safekeepers                                                                                []string
		port                                                                                       int
		feedCommit, noArchive, debug, restartOnCrash                                               bool
		readyFile, importFrom                                                                      string
	)
	cmd := &cobra.Command{
		Use:   "compute",
		Short: "Run PostgreSQL 15 on the strata FUSE data directory (the compute agent)",
		Long: `Run the compute agent: it wins a safekeeper election, mounts PGDATA as a FUSE
filesystem served by the pageserver timeline (with the cache tiers of
compute.cache), refills local pg_wal from the safekeepers, and starts Postgres
as compute.os_user; on an empty timeline it runs initdb first (on local
scratch, then copies its output into the mount), or with --import-from copies
a stopped PostgreSQL 15 data directory into the mount instead.
With storage.page_source: redo, relation page writes stay in a local page
store (compute.redo_store_pages) and evicted pages are read back from the
redo timeline (--timeline), which the pageserver rebuilds from the WAL the
safekeepers hold; non-relation files go to --files-timeline; a new cluster's
initdb output is imported into the redo timeline as its base; wal_log_hints
is forced on. It restarts Postgres from storage whenever it exits, and on SIGINT/SIGTERM
stops it (fast shutdown), waits until every write is durable and unmounts.
With --restart-on-crash (what strata up uses) a small supervisor runs the
agent as its child and starts it again, with a backoff, when the agent dies
after it was ready once; a first start that fails is reported, not retried.

Secrets come from the environment: STRATA_COMPUTE_PASSWORD (the postgres
superuser's password, set by initdb) and STRATA_COMPUTE_REPL_PASSWORD (the
safekeepers' replication role, created or updated at every start).`,
		Example: `  STRATA_COMPUTE_PASSWORD=secret strata compute --pageserver 127.0.0.1:7679 \
    --timeline 0123456789abcdef0123456789abcdef \
    --safekeepers 127.0.0.1:7676,127.0.0.1:7677,127.0.0.1:7678 \
    --mountpoint /var/lib/strata/pgdata --scratch /var/lib/strata/scratch --port 25432`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			full, err := a.load()
			if err != nil {
				return err
			}
			log, err := a.logger(full, "compute")
			if err != nil {
				return err
			}
			if restartOnCrash {
				// An agent killed while one of its threads waits on its own
				// FUSE mount cannot finish dying until the mount's
				// connection is aborted.
				return superviseSelf(cmd.Context(), "compute agent", readyFile, func(pid int) {
					if err := fusefs.MountpointCleanup(mountpoint); err != nil {
						log.Error().Err(err).Int("pid", pid).Str("mountpoint", mountpoint).Msg("releasing the killed agent's FUSE mount")
					}
				}, log, "import-from") // an agent started again never imports: the cluster holds its data
			}
			tl, err := pg.ParseTimelineID(timeline)
			if err != nil {
				return fmt.Errorf("compute: --timeline: %w", err)
			}
			var filesTL pg.TimelineID
			switch {
			case full.Storage.PageSource == config.PageSourceRedo && filesTimeline == "":
				return fmt.Errorf("compute: storage.page_source redo needs --files-timeline (the timeline of the non-relation files)")
			case full.Storage.PageSource != config.PageSourceRedo && filesTimeline != "":
				return fmt.Errorf("compute: --files-timeline is for storage.page_source redo, not %s", full.Storage.PageSource)
			case filesTimeline != "":
				if filesTL, err = pg.ParseTimelineID(filesTimeline); err != nil {
					return fmt.Errorf("compute: --files-timeline: %w", err)
				}
			}
			budget, err := full.Compute.MemoryBudgetBytes()
			if err != nil {
				return err
			}
			if port == 0 {
				port = full.Compute.Port
			}
			settings := map[string]string{}
			if full.Compute.SharedBuffers != "" {
				settings["shared_buffers"] = "'" + full.Compute.SharedBuffers + "'"
			}
			for k, v := range full.Compute.Settings {
				settings[k] = v
			}
			reg := metrics.NewRegistry()
			cfg := agent.Config{
				Pageserver: pageserver, Timeline: tl, Safekeepers: safekeepers,
				ComputeID: computeID, Mountpoint: mountpoint, Scratch: scratch, Port: port,
				OSUser: full.Compute.OSUser, PGBinDir: full.Compute.PGBinDir,
				Password: os.Getenv(config.EnvComputePassword), ReplUser: replUser, ReplPassword: os.Getenv(config.EnvComputeReplPassword),
				FullPageWrites: full.Compute.FullPageWrites, Settings: settings, PGWal: full.Compute.PGWal,
				Cache: agent.CacheConfig{Strategy: full.Compute.Cache.Strategy, MemoryBudget: budget,
					LFC: full.Compute.Cache.LFC, SharedBuffers: full.Compute.Cache.SharedBuffers,
					Prewarm: full.Compute.Cache.Prewarm, PrewarmInterval: full.Compute.Cache.PrewarmInterval},
				PageSource: full.Storage.PageSource, FilesTimeline: filesTL, RedoStorePages: full.Compute.RedoStorePages,
				ReadAhead:  full.Compute.ReadAhead,
				FeedCommit: feedCommit, Debug: debug, Log: log, Registry: reg, ImportFrom: importFrom,
				ArchivePrefix: "wal",
			}
			if cfg.ReplPassword == "" {
				cfg.ReplUser = ""
			}
			if adv := full.Compute.Cache.Advisor; adv.Enabled() {
				section, err := json.Marshal(adv.Plugin.Config)
				if err != nil {
					return fmt.Errorf("compute.cache.advisor.plugin.config: %w", err)
				}
				cfg.Cache.Advisor = &agent.AdvisorConfig{Every: adv.Every, Plugin: pluginhost.Spec{
					Name: "cache-advisor", Path: adv.Plugin.Path, Args: adv.Plugin.Args, SHA256: adv.Plugin.SHA256, ConfigJSON: section,
				}}
			}
			if !noArchive {
				st, err := objstore.Open(cmd.Context(), full.ObjectStore, log, reg)
				if err != nil {
					return err
				}
				defer st.Close()
				cfg.Archive = st
			}
			ag, err := agent.New(cfg)
			if err != nil {
				return err
			}
			// A FUSE mount left at the mountpoint is a dead agent's (one
			// agent per mountpoint): release it before binding, as a dead
			// agent stuck on its own mount still holds its ports.
			if err := fusefs.MountpointCleanup(mountpoint); err != nil {
				log.Warn().Err(err).Str("mountpoint", mountpoint).Msg("releasing a mount left at the mountpoint")
			}
			if metricsAddr != "" {
				lis, err := listenRetry(metricsAddr, 5*time.Second)
				if err != nil {
					return err
				}
				srv := &http.Server{Handler: ag.Handler(), ReadHeaderTimeout: 5 * time.Second}
				go srv.Serve(lis)
				defer srv.Close()
				log.Info().Str("addr", lis.Addr().String()).Msg("metrics and /waits")
			}
			s := ag.Sizing()
			log.Info().Str("strategy", s.Strategy).Int64("budget_bytes", s.BudgetBytes).Int64("shared_buffers_bytes", s.SharedBuffersBytes()).
				Int64("lfc_bytes", s.LFCBytes).Str("huge_pages", s.HugePages).Msg("memory plan")
			return ag.Run(cmd.Context(), func(url string) {
				log.Info().Msg("postgres is ready")
				if readyFile != "" {
					_ = os.WriteFile(readyFile, []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n"), 0o600)
				}
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&pageserver, "pageserver", "127.0.0.1:7679", "pageserver gRPC address")
	f.StringVar(&timeline, "timeline", "", "pageserver timeline ID (32 hex digits; created when missing)")
	f.StringVar(&filesTimeline, "files-timeline", "", "storage.page_source redo: the timeline of the non-relation files (--timeline is then the redo timeline; created when missing)")
	f.StringSliceVar(&safekeepers, "safekeepers", nil, "gRPC addresses of every safekeeper of the group")
	f.StringVar(&mountpoint, "mountpoint", "", "PGDATA: where the FUSE filesystem is mounted")
	f.StringVar(&scratch, "scratch", "", "local folder for pg_wal, the LFC file, the socket and the Postgres log")
	f.IntVar(&port, "port", 0, "Postgres TCP port on 127.0.0.1 (default compute.port)")
	f.StringVar(&computeID, "compute-id", "", "this compute's name in the safekeeper election (default host-pid)")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve /metrics and /waits on this address (empty: off)")
	f.StringVar(&replUser, "repl-user", "strata_repl", "replication role the safekeepers stream as (managed when STRATA_COMPUTE_REPL_PASSWORD is set)")
	f.BoolVar(&feedCommit, "feed-commit", false, "advance the pageserver's commit LSN from the safekeepers (for a pageserver that does not follow them)")
	f.BoolVar(&noArchive, "no-archive", false, "refill pg_wal from the safekeepers only, not from the object store's WAL archive")
	f.BoolVar(&debug, "debug-fuse", false, "log every FUSE request")
	f.StringVar(&importFrom, "import-from", "", "a new cluster: start from this stopped PostgreSQL 15 data directory (read only) instead of initdb")
	f.StringVar(&readyFile, "ready-file", "", "write this file once Postgres accepts connections")
	f.BoolVar(&restartOnCrash, restartOnCrashFlag, false, "run the agent as a child process and start it again when it dies (kill -9, a crash) after it was ready once; killing this process kills the agent")
	for _, req := range []string{"timeline", "safekeepers", "mountpoint", "scratch"} {
		_ = cmd.MarkFlagRequired(req)
	}
	cmd.AddCommand(newComputeWaitsCmd(a))
	return cmd
}

// newComputeWaitsCmd returns `strata compute waits`: the running agent's
// wait report (count, total and mean per wait kind). Without --addr it asks
// the agent of the `strata up` cluster that the config describes.
func newComputeWaitsCmd(a *app) *cobra.Command {
	var addr string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "waits",
		Short: "Show the compute agent's wait accounting (count, total, mean per wait kind)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !cmd.Flags().Changed("addr") {
				c, err := a.cluster()
				if err != nil {
					return err
				}
				addr = c.ComputeMetricsAddr()
				if addr == "" {
					return errors.New("compute waits: the cluster runs without metrics (cluster.metrics_port is 0), and the agent serves its report there; set the port, or pass --addr of an agent started by hand")
				}
			}
			r, err := fetchWaits(cmd.Context(), addr)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			}
			return agent.PrintReport(cmd.OutOrStdout(), r)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "the agent's --metrics-addr (default: the agent of the config's `strata up` cluster)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func fetchWaits(ctx context.Context, addr string) (agent.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/waits", nil)
	if err != nil {
		return agent.Report{}, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return agent.Report{}, fmt.Errorf("compute waits: no agent answers on %s (is the cluster up, or the agent running with --metrics-addr %s?): %w", addr, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return agent.Report{}, errors.New("compute waits: " + resp.Status)
	}
	var r agent.Report
	err = json.NewDecoder(resp.Body).Decode(&r)
	return r, err
}

// listenRetry listens on addr, trying again for up to d while the address
// is in use: a dead agent that MountpointCleanup just released frees its
// ports a moment later, when it has exited.
func listenRetry(addr string, d time.Duration) (net.Listener, error) {
	deadline := time.Now().Add(d)
	for {
		lis, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return lis, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
