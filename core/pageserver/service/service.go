// Package service assembles a running pageserver: the Pageserver over its
// data directory and object store, the gRPC server, the /metrics endpoint
// and, for a timeline bound to a safekeeper group, the safekeeper link
// (commit LSN, WAL ingest). `strata pageserver` is flags around Run; tests
// run the same code in process or in a test binary.
//
// It is not the storage engine (core/pageserver and below) nor the wire
// API (core/pageserver/server).
package service

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/metrics"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/server"
	"github.com/stratadb/strata/core/pageserver/sklink"
	"github.com/stratadb/strata/core/pageserver/walingest"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// Options configure Run.
type Options struct {
	Config pageserver.Config
	// Store is the object store (nil: local only).
	Store objectstore.Store
	Log   zerolog.Logger
	// Registry receives the metrics (nil: a new one); served on
	// Config.MetricsAddr when set.
	Registry *prometheus.Registry
	// Safekeepers and Timeline bind that timeline to the safekeeper group
	// (both or neither).
	Safekeepers []string
	Timeline    pg.TimelineID
	// SafekeeperPoll is the status poll interval while page writes wait
	// for the commit LSN (0: sklink's default).
	SafekeeperPoll time.Duration
	// Ready (may be nil) is called with the gRPC address once serving.
	Ready func(addr string, ps *pageserver.Pageserver)
}

// Run serves until ctx ends (then stops gracefully, at most 5 s) or the
// gRPC server fails.
func Run(ctx context.Context, o Options) error {
	cfg := o.Config
	if err := cfg.Validate(); err != nil {
		return err
	}
	log := o.Log
	reg := o.Registry
	if reg == nil {
		reg = metrics.NewRegistry()
	}
	deps := pageserver.Deps{Log: log, Registry: reg, Store: o.Store}
	if cfg.ImagePolicy != "writeback" {
		// WAL deltas need the Go redo engine to be materialized.
		deps.Redo = walingest.Redo{Engine: postgres.NewEngine(postgres.Options{})}
	}
	var link *sklink.Link
	if len(o.Safekeepers) > 0 || !o.Timeline.IsZero() {
		var err error
		link, err = sklink.New(sklink.Config{Safekeepers: o.Safekeepers, Timeline: o.Timeline, FastPoll: o.SafekeeperPoll},
			sklink.Options{Ingest: cfg.ImagePolicy != "writeback"}, log, reg)
		if err != nil {
			return err
		}
		deps = link.Deps(deps)
	}
	ps, err := pageserver.New(ctx, cfg, deps)
	if err != nil {
		if link != nil {
			link.Close()
		}
		return err
	}
	defer ps.Close()
	if link != nil {
		lctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = link.Run(lctx, ps); close(done) }()
		// Runs before ps.Close: the link stops using the timelines first.
		defer func() { stop(); <-done; link.Close() }()
		log.Info().Stringer("timeline", o.Timeline).Strs("safekeepers", o.Safekeepers).Str("image_policy", cfg.ImagePolicy).Msg("timeline bound to the safekeepers")
	}
	if cfg.MetricsAddr != "" {
		ms, err := metrics.Serve(cfg.MetricsAddr, reg, log)
		if err != nil {
			return err
		}
		defer ms.Close()
	}
	lis, err := net.Listen("tcp", cfg.ListenAddr)
	if err != nil {
		return err
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(256 << 20))
	server.New(ps, log, reg).Register(g)
	log.Info().Str("addr", lis.Addr().String()).Str("data_dir", cfg.DataDir).Int("timelines", len(ps.Timelines())).
		Uint64("incarnation", ps.Incarnation()).Msg("pageserver listening")
	errc := make(chan error, 1)
	go func() { errc <- g.Serve(lis) }()
	if o.Ready != nil {
		o.Ready(lis.Addr().String(), ps)
	}
	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down")
		stopped := make(chan struct{})
		go func() { g.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			g.Stop()
		}
		return nil
	case err := <-errc:
		if errors.Is(err, grpc.ErrServerStopped) {
			return nil
		}
		return err
	}
}
