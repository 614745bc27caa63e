package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/logging"
	"github.com/stratadb/strata/core/metrics"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/service"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// newPageserverCmd returns `strata pageserver`: the page server. The object
// store and logging come from the config file (--config); pageserver
// settings come from flags until the config grows a `pageserver:` section
// (pageserver.Config).
func newPageserverCmd() *cobra.Command {
	cfg := pageserver.DefaultConfig()
	var noStore bool
	var safekeepers []string
	var boundTL, filesTL string
	var fastPoll time.Duration
	var bootFrom string
	var restartOnCrash bool
	cmd := &cobra.Command{
		Use:   "pageserver",
		Short: "Serve versioned pages (GetPage@LSN) from layer files synced to the object store",
		Long: `The pageserver keeps every timeline's page versions in an in-memory layer backed
by an append-only log, flushes them into immutable delta and image layer files,
uploads those with a per-timeline manifest to the object store, and answers
GetPage@LSN, Nblocks, GetFile and basebackup over gRPC. In writeback mode it stores
the compute's page writes, durable only once the safekeeper quorum's commit LSN
reaches the write's WAL position. Started on an empty data directory, it serves
every timeline of the object store, fetching layers on demand.

With --safekeepers and --timeline, that timeline is bound to the safekeeper
group: its commit LSN comes from the safekeepers (polled, fast while page
writes wait for it), and with the fpi and pushdown image policies the
pageserver follows the group's committed WAL into the timeline from its last
ingested record (once the timeline exists and holds a base, e.g. an imported
initdb output), reporting its positions back. Other timelines take their
commit LSN from the AdvanceCommitLSN call.

In redo mode (storage.page_source: redo) --timeline is the redo timeline:
relation pages come from WAL ingest only (on top of the initdb output the
compute imports), so --image-policy must be fpi, pushdown or hot; --files-timeline
names the timeline of the compute's non-relation files (pg_control, pg_xact,
...), gated by the same safekeepers' commit LSN.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			path, _ := cmd.Flags().GetString("config")
			if path == "" {
				if _, err := os.Stat(config.DefaultPath); err == nil {
					path = config.DefaultPath
				}
			}
			full, err := config.Load(path)
			if err != nil {
				return err
			}
			if lvl, _ := cmd.Flags().GetString("log-level"); lvl != "" {
				full.Log.Level = lvl
			}
			if f, _ := cmd.Flags().GetString("log-format"); f != "" {
				full.Log.Format = f
			}
			log, err := logging.New(os.Stderr, full.Log.Level, full.Log.Format)
			if err != nil {
				return err
			}
			log = log.With().Str("component", "pageserver").Logger()
			if err := cfg.Validate(); err != nil {
				return err
			}
			if restartOnCrash {
				return superviseSelf(ctx, "pageserver", "", nil, log)
			}
			reg := metrics.NewRegistry()
			var store objectstore.Store
			if !noStore {
				st, err := objstore.Open(ctx, full.ObjectStore, log, reg)
				if err != nil {
					return err
				}
				defer st.Close()
				store = st
			}
			o := service.Options{Config: cfg, Store: store, Log: log, Registry: reg, Safekeepers: safekeepers, SafekeeperPoll: fastPoll, BootstrapFrom: bootFrom}
			if len(safekeepers) > 0 || bootFrom != "" {
				if boundTL == "" {
					return fmt.Errorf("--safekeepers and --bootstrap-from need --timeline")
				}
			}
			if boundTL != "" {
				if o.Timeline, err = pg.ParseTimelineID(boundTL); err != nil {
					return fmt.Errorf("--timeline: %w", err)
				}
			}
			if filesTL != "" {
				if o.FilesTimeline, err = pg.ParseTimelineID(filesTL); err != nil {
					return fmt.Errorf("--files-timeline: %w", err)
				}
				if o.FilesTimeline == o.Timeline {
					return fmt.Errorf("--files-timeline must differ from --timeline")
				}
			}
			return service.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.ListenAddr, "listen", cfg.ListenAddr, "gRPC listen address")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", cfg.MetricsAddr, "Prometheus /metrics address (empty: off)")
	f.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "local data directory")
	f.StringVar(&cfg.ImagePolicy, "image-policy", cfg.ImagePolicy, "image policy: writeback, fpi, pushdown or hot")
	f.IntVar(&cfg.PushdownDeltas, "pushdown-deltas", cfg.PushdownDeltas, "pushdown and hot: materialize a page after this many deltas")
	f.IntVar(&cfg.PushdownBytes, "pushdown-bytes", cfg.PushdownBytes, "pushdown and hot: ... or after this many bytes of deltas (0: no limit)")
	f.Int64Var(&cfg.ImageLayerBytes, "image-layer-bytes", cfg.ImageLayerBytes, "write image layers of the changed key ranges after this many bytes of delta layers (and not before they reach the size of the images they replace)")
	f.IntVar(&cfg.HotBurst, "hot-burst", cfg.HotBurst, "hot: materialize at once a page with this many deltas in one ingest batch")
	f.Int64Var(&cfg.CheckpointDistance, "checkpoint-distance", cfg.CheckpointDistance, "freeze the in-memory layer at this many bytes")
	f.DurationVar(&cfg.CheckpointTimeout, "checkpoint-timeout", cfg.CheckpointTimeout, "freeze the in-memory layer at this age")
	f.Int64Var(&cfg.LayerTargetSize, "layer-target-size", cfg.LayerTargetSize, "target layer file size in bytes")
	f.IntVar(&cfg.CompactionThreshold, "compaction-threshold", cfg.CompactionThreshold, "compact at this many L0 layers")
	f.Uint64Var(&cfg.GCHorizon, "gc-horizon", cfg.GCHorizon, "keep this many bytes of WAL history")
	f.DurationVar(&cfg.PITR, "pitr", cfg.PITR, "keep this much history in time")
	f.DurationVar(&cfg.WaitLSNTimeout, "wait-lsn-timeout", cfg.WaitLSNTimeout, "GetPage wait for WAL at most this long")
	f.Int64Var(&cfg.CacheBytes, "cache-bytes", cfg.CacheBytes, "materialized page cache per timeline, bytes")
	f.Int64Var(&cfg.MaxLocalBytes, "max-local-bytes", cfg.MaxLocalBytes, "evict cold uploaded layers above this many local bytes per timeline (0: never)")
	f.IntVar(&cfg.UploadParallelism, "upload-parallelism", cfg.UploadParallelism, "concurrent layer uploads")
	f.BoolVar(&restartOnCrash, restartOnCrashFlag, false, "run the pageserver as a child process and start it again when it dies (kill -9, a crash) after it ran 10 s; killing this process kills the pageserver (a compute whose page writes were not yet durable then restarts Postgres)")
	f.BoolVar(&noStore, "no-object-store", false, "run without an object store (nothing survives the loss of the data directory)")
	f.StringSliceVar(&safekeepers, "safekeepers", nil, "gRPC addresses of the safekeeper group (host:port,host:port,...) bound to --timeline")
	f.StringVar(&boundTL, "timeline", "", "timeline ID bound to --safekeepers (commit LSN; WAL ingest with fpi and pushdown)")
	f.StringVar(&filesTL, "files-timeline", "", "redo mode (storage.page_source: redo): the compute's non-relation files live on this timeline, gated by --safekeepers; --timeline is the redo timeline WAL ingest feeds (needs --image-policy fpi, pushdown or hot)")
	f.StringVar(&bootFrom, "bootstrap-from", "", "a cleanly stopped data directory (initdb's output) imported into --timeline at its checkpoint LSN unless done already: the base WAL ingest starts from")
	f.DurationVar(&fastPoll, "safekeeper-poll", 2*time.Millisecond, "safekeeper status poll interval while page writes wait for the commit LSN")
	return cmd
}

// newTimelineCmd returns `strata timeline`: create, branch and list the
// timelines of a running pageserver.
func newTimelineCmd() *cobra.Command {
	var addr string
	dial := func() (*client.Client, error) { return client.Dial(addr) }
	cmd := &cobra.Command{Use: "timeline", Short: "Create, branch and list timelines on a pageserver"}
	cmd.PersistentFlags().StringVar(&addr, "pageserver", pageserver.DefaultConfig().ListenAddr, "pageserver gRPC address")

	create := &cobra.Command{
		Use:   "create [TIMELINE_ID]",
		Short: "Create an empty root timeline (a random ID when none is given)",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := timelineArg(args)
			if err != nil {
				return err
			}
			c, err := dial()
			if err != nil {
				return err
			}
			defer c.Close()
			if _, err := c.CreateTimeline(cmd.Context(), id); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), id)
			return nil
		},
	}
	var at, parent string
	branch := &cobra.Command{
		Use:   "branch --from PARENT [--at LSN] [NEW_TIMELINE_ID]",
		Short: "Branch a timeline at an LSN (default: its last record); reads below the LSN fall through to the parent",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := pg.ParseTimelineID(parent)
			if err != nil {
				return err
			}
			var lsn pg.LSN
			if at != "" {
				if lsn, err = pg.ParseLSN(at); err != nil {
					return err
				}
			}
			id, err := timelineArg(args)
			if err != nil {
				return err
			}
			c, err := dial()
			if err != nil {
				return err
			}
			defer c.Close()
			info, err := c.Branch(cmd.Context(), p, id, lsn)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s\tfrom %s at %s\n", info.ID, info.Ancestor, info.AncestorLSN)
			return nil
		},
	}
	branch.Flags().StringVar(&parent, "from", "", "parent timeline ID (required)")
	branch.Flags().StringVar(&at, "at", "", "branch LSN, as X/Y")
	_ = branch.MarkFlagRequired("from")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List timelines with their LSNs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := dial()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			tls, err := c.ListTimelines(ctx)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 2, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TIMELINE\tANCESTOR\tANCESTOR_LSN\tLAST_RECORD\tDURABLE\tREMOTE\tGC_CUTOFF\tLAYERS")
			for _, t := range tls {
				anc, alsn := "-", "-"
				if !t.Ancestor.IsZero() {
					anc, alsn = t.Ancestor.String(), t.AncestorLSN.String()
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", t.ID, anc, alsn, t.LSNs.LastRecord, t.LSNs.Durable, t.LSNs.RemoteConsistent, t.LSNs.GCCutoff, t.Layers)
			}
			return w.Flush()
		},
	}
	cmd.AddCommand(create, branch, ls)
	return cmd
}

func timelineArg(args []string) (pg.TimelineID, error) {
	if len(args) == 1 {
		return pg.ParseTimelineID(args[0])
	}
	var id pg.TimelineID
	_, err := rand.Read(id[:])
	return id, err
}
