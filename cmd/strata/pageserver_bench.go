package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/loadgen"
	"github.com/stratadb/strata/sdk/pg"
)

// withPageserverBench adds `strata pageserver bench` to the pageserver
// command.
func withPageserverBench(ps *cobra.Command) *cobra.Command {
	ps.AddCommand(newPageserverBenchCmd())
	return ps
}

// newPageserverBenchCmd returns `strata pageserver bench`: the GetPage load
// generator (core/pageserver/loadgen).
func newPageserverBenchCmd() *cobra.Command {
	var (
		addr, modes, tlHex string
		cfg                loadgen.Config
		layerSize          int64
		skipSetup          bool
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure GetPage latency and throughput with concurrent gRPC clients",
		Long: `bench writes a working set of pages (two versions each) into a timeline and reads
them back with --clients concurrent readers over gRPC, printing p50/p90/p99/p99.9/max
latency (HDR histograms) and pages per second for each mode:

  cached    reads at the latest LSN, answered by the pageserver's page cache
  uncached  reads at an older LSN, materialized from local layer files every time
  cold      one pass after the layer files were evicted to the object store

Without --addr it starts a pageserver in this process (in a temporary folder, with an
in-memory object store) so that it can flush and evict layers between modes; with
--addr it drives a running pageserver (cached and uncached only; uncached reads then
come from whatever layers that pageserver holds).`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if tlHex != "" {
				id, err := pg.ParseTimelineID(tlHex)
				if err != nil {
					return err
				}
				cfg.Timeline = id
			}
			var ms []loadgen.Mode
			for _, s := range strings.Split(modes, ",") {
				m, err := loadgen.ParseMode(strings.TrimSpace(s))
				if err != nil {
					return err
				}
				if m == loadgen.Cold && addr != "" {
					return fmt.Errorf("mode cold needs the in-process pageserver (no --addr)")
				}
				ms = append(ms, m)
			}
			cfg.Progress = cmd.ErrOrStderr()
			if addr != "" {
				c, err := client.Dial(addr)
				if err != nil {
					return err
				}
				defer c.Close()
				if !skipSetup {
					if err := loadgen.Setup(ctx, c, cfg); err != nil {
						return err
					}
				}
				for _, m := range ms {
					cfg.Mode = m
					r, err := loadgen.Run(ctx, c, cfg)
					if err != nil {
						return err
					}
					fmt.Fprintln(cmd.OutOrStdout(), r)
				}
				return nil
			}
			return benchLocal(ctx, cmd, cfg, ms, layerSize)
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, "addr", "", "pageserver gRPC address (empty: start one in this process)")
	f.StringVar(&modes, "mode", "cached,uncached,cold", "modes to run, comma-separated: cached, uncached, cold")
	f.StringVar(&tlHex, "timeline", "", "timeline ID in hex (default "+loadgen.DefaultTimeline.String()+")")
	f.IntVar(&cfg.Clients, "clients", 16, "concurrent readers")
	f.Uint32Var(&cfg.Pages, "pages", 4096, "working set in 8 KiB pages")
	f.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured time per mode")
	f.Int64Var(&cfg.Requests, "requests", 0, "stop each mode after this many reads (0: --duration only)")
	f.Int64Var(&layerSize, "layer-target-size", 1<<20, "in-process pageserver: layer file size (cold reads download one per miss)")
	f.BoolVar(&skipSetup, "skip-setup", false, "with --addr: the working set is there already")
	return cmd
}

// benchLocal runs the modes against an in-process pageserver: setup,
// flush to layer files, then each mode. Cold runs on a second pageserver
// whose layers are evicted (an evicting pageserver would also evict
// between the uncached reads).
func benchLocal(ctx context.Context, cmd *cobra.Command, cfg loadgen.Config, ms []loadgen.Mode, layerSize int64) error {
	var warm, cold []loadgen.Mode
	for _, m := range ms {
		if m == loadgen.Cold {
			cold = append(cold, m)
		} else {
			warm = append(warm, m)
		}
	}
	for _, set := range [][]loadgen.Mode{warm, cold} {
		if len(set) == 0 {
			continue
		}
		if err := benchOne(ctx, cmd, cfg, set, layerSize, set[0] == loadgen.Cold); err != nil {
			return err
		}
	}
	return nil
}

func benchOne(ctx context.Context, cmd *cobra.Command, cfg loadgen.Config, ms []loadgen.Mode, layerSize int64, evict bool) error {
	dir, err := os.MkdirTemp("", "strata-pageserver-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	l, err := loadgen.StartLocal(ctx, loadgen.LocalOptions{Dir: dir, LayerTargetSize: layerSize, Evictable: evict}, zerolog.Nop())
	if err != nil {
		return err
	}
	defer l.Close()
	c, err := client.Dial(l.Addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := loadgen.Setup(ctx, c, cfg); err != nil {
		return err
	}
	if err := l.Flush(ctx, pickTimeline(cfg)); err != nil {
		return err
	}
	if evict {
		n, err := l.Evict(ctx, pickTimeline(cfg))
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.ErrOrStderr(), "evicted %d layer files to the object store\n", n)
	}
	for _, m := range ms {
		cfg.Mode = m
		r, err := loadgen.Run(ctx, c, cfg)
		if err != nil {
			return err
		}
		fmt.Fprintln(cmd.OutOrStdout(), r)
	}
	return nil
}

func pickTimeline(cfg loadgen.Config) pg.TimelineID {
	if cfg.Timeline.IsZero() {
		return loadgen.DefaultTimeline
	}
	return cfg.Timeline
}
