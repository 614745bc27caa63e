// Command psproc runs the pageserver service (core/pageserver/service, the
// code `strata pageserver` runs) over an fs object store that can inject
// faults, for the end-to-end tests that kill -9 a pageserver process. It
// can bootstrap the bound timeline from a stopped data directory (initdb's
// output) the first time (--bootstrap-from). Tests only.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/service"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/pg"
)

func main() {
	cfg := pageserver.DefaultConfig()
	var (
		storeDir, sks, tl, bootDir string
		faultFor                   time.Duration
		seed                       uint64
	)
	flag.StringVar(&cfg.DataDir, "data-dir", "", "local data directory")
	flag.StringVar(&cfg.ListenAddr, "listen", "127.0.0.1:0", "gRPC address")
	flag.StringVar(&cfg.ImagePolicy, "image-policy", "fpi", "image policy")
	flag.Int64Var(&cfg.CheckpointDistance, "checkpoint-distance", 1<<20, "in-memory layer size")
	flag.Int64Var(&cfg.LayerTargetSize, "layer-target-size", 512<<10, "layer file size")
	flag.DurationVar(&cfg.CheckpointTimeout, "checkpoint-timeout", 2*time.Second, "in-memory layer age")
	flag.StringVar(&storeDir, "store", "", "fs object store root")
	flag.StringVar(&sks, "safekeepers", "", "safekeeper addresses (comma separated; empty: no link)")
	flag.StringVar(&tl, "timeline", "", "bound timeline")
	flag.StringVar(&bootDir, "bootstrap-from", "", "import this cleanly stopped data directory into the timeline (service.Options.BootstrapFrom)")
	flag.DurationVar(&faultFor, "faults-for", 0, "inject object store faults (errors, latency) for this long after start")
	flag.Uint64Var(&seed, "fault-seed", 1, "fault generator seed")
	flag.Parse()
	cfg.MetricsAddr = ""
	cfg.GCHorizon = 1 << 40
	log := zerolog.New(os.Stderr).With().Timestamp().Logger()
	if err := run(cfg, storeDir, sks, tl, bootDir, faultFor, seed, log); err != nil {
		log.Error().Err(err).Msg("psproc")
		os.Exit(1)
	}
}

func run(cfg pageserver.Config, storeDir, sks, tl, bootDir string, faultFor time.Duration, seed uint64, log zerolog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	fst, err := fs.New(fs.Config{Root: storeDir}, log)
	if err != nil {
		return err
	}
	var st objectstore.Store = fst
	if faultFor > 0 {
		f := faulty.New(st, faulty.Config{Seed: seed, Rules: []faulty.Rule{
			{Ops: faulty.OpPut | faulty.OpGet | faulty.OpGetRange | faulty.OpList, Fault: faulty.FailCall, Transient: true, Probability: 0.3},
			{Ops: faulty.OpPut, Fault: faulty.FailCall, Probability: 0.1},
			{Ops: faulty.OpPut, Fault: faulty.FailStream, Transient: true, After: 4096, Probability: 0.1},
			{Fault: faulty.Delay, Latency: 20 * time.Millisecond},
		}})
		st = f
		go func() {
			select {
			case <-ctx.Done():
			case <-time.After(faultFor):
			}
			f.Reset()
			log.Info().Int("fired", f.Fired()).Msg("object store faults off")
		}()
	}
	st = objectstore.WithRetry(st, objectstore.DefaultRetryPolicy(), log)
	defer st.Close()
	o := service.Options{Config: cfg, Store: st, Log: log, BootstrapFrom: bootDir}
	if tl != "" {
		if o.Timeline, err = pg.ParseTimelineID(tl); err != nil {
			return err
		}
	}
	if sks != "" {
		o.Safekeepers = strings.Split(sks, ",")
	}
	o.Ready = func(addr string, ps *pageserver.Pageserver) {
		fmt.Printf("READY %s %d\n", addr, ps.Incarnation())
	}
	return service.Run(ctx, o)
}
