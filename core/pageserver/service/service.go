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
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
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
	// Safekeepers bind Timeline to the safekeeper group (none: Timeline
	// only names the timeline to bootstrap).
	Safekeepers []string
	Timeline    pg.TimelineID
	// FilesTimeline, with Safekeepers, puts the group in redo mode
	// (storage.page_source: redo): Timeline is the redo timeline (WAL
	// ingest on top of the imported initdb base, so the image policy must
	// be fpi or pushdown) and FilesTimeline holds the compute's
	// non-relation files, gated by the same commit LSN.
	FilesTimeline pg.TimelineID
	// SafekeeperPoll is the status poll interval while page writes wait
	// for the commit LSN (0: sklink's default).
	SafekeeperPoll time.Duration
	// BootstrapFrom, with Timeline set, is a cleanly stopped data
	// directory (initdb's output) imported into Timeline at its shutdown
	// checkpoint LSN when Timeline does not exist yet: the base from which
	// WAL ingest starts (fpi, pushdown) or that a first compute starts from
	// (writeback).
	BootstrapFrom string
	// Ready (may be nil) is called with the gRPC address once serving.
	Ready func(addr string, ps *pageserver.Pageserver)
}

// ErrBootstrap: the bootstrap data directory cannot be used.
var ErrBootstrap = errors.New("service: bad bootstrap data directory")

// ControlCheckpoint reads the checkpoint LSN of a cleanly shut down
// PostgreSQL 15 data directory from global/pg_control.
func ControlCheckpoint(dir string) (pg.LSN, error) {
	b, err := os.ReadFile(filepath.Join(dir, "global", "pg_control"))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrBootstrap, err)
	}
	// ControlFileData: system_identifier u64, pg_control_version u32,
	// catalog_version_no u32, state i32 (+4 padding), time i64,
	// checkPoint u64 at 32 (little-endian on the platforms strata runs on).
	if len(b) < 40 {
		return 0, fmt.Errorf("%w: pg_control of %d bytes", ErrBootstrap, len(b))
	}
	if v := binary.LittleEndian.Uint32(b[8:]); v != 1300 {
		return 0, fmt.Errorf("%w: pg_control_version %d, want 1300 (PostgreSQL 15)", ErrBootstrap, v)
	}
	if st := binary.LittleEndian.Uint32(b[16:]); st != 1 { // DB_SHUTDOWNED
		return 0, fmt.Errorf("%w: the cluster was not shut down cleanly (state %d)", ErrBootstrap, st)
	}
	return pg.LSN(binary.LittleEndian.Uint64(b[32:])), nil
}

// bootstrap imports o.BootstrapFrom into o.Timeline unless that was done:
// a marker file (bootstrap-<timeline>.done in the data directory) is
// written once the imported versions are durable (the commit LSN reached
// the checkpoint), and a timeline whose last record is past the
// checkpoint has ingested or taken writes after its base. Until then an
// interrupted import is redone (the same versions at the same LSN). A
// timeline that has a base while the directory is no longer a cleanly
// stopped one (Postgres has run on it since) was imported too: a
// replacement pageserver on an empty disk finds it in the object store,
// without the marker. It returns a function that writes the marker when
// the base is durable.
func bootstrap(ctx context.Context, ps *pageserver.Pageserver, o Options) (func(context.Context), error) {
	marker := filepath.Join(o.Config.DataDir, "bootstrap-"+o.Timeline.String()+".done")
	if _, err := os.Stat(marker); err == nil {
		return nil, nil
	}
	tl, terr := ps.Timeline(o.Timeline)
	w, err := ControlCheckpoint(o.BootstrapFrom)
	if terr == nil && tl.LSNs().LastRecord > 0 && (err != nil || tl.LSNs().LastRecord > w) {
		if err != nil {
			o.Log.Info().Stringer("timeline", o.Timeline).Stringer("last_record", tl.LSNs().LastRecord).Str("reason", err.Error()).
				Msg("bootstrap data directory not imported: the timeline already has its base")
		}
		return nil, nil
	}
	if err != nil {
		if terr != nil && o.Store != nil {
			// A replacement on an empty disk whose object store has no
			// copy of the timeline: the first pageserver never uploaded
			// the base, or this is another store.
			return nil, fmt.Errorf("%w (timeline %s is neither on this disk nor in the object store, so it was never uploaded there or this is another object store; a data directory Postgres has run on cannot be imported again)", err, o.Timeline)
		}
		return nil, err
	}
	if terr != nil {
		if tl, err = ps.CreateTimeline(ctx, o.Timeline); err != nil {
			return nil, err
		}
	}
	if err := pageserver.ImportDataDir(ctx, tl, o.BootstrapFrom, w); err != nil {
		return nil, fmt.Errorf("service: importing %s: %w", o.BootstrapFrom, err)
	}
	o.Log.Info().Stringer("timeline", o.Timeline).Str("from", o.BootstrapFrom).Stringer("lsn", w).Msg("timeline bootstrapped from a data directory")
	return func(ctx context.Context) {
		for tl.LSNs().Durable < w || tl.LSNs().Pending > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err := os.WriteFile(marker, []byte(w.String()+"\n"), 0o644); err != nil {
			o.Log.Error().Err(err).Msg("writing the bootstrap marker")
		}
	}, nil
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
	// A registry reused by a restarted service keeps its first gauge.
	_ = reg.Register(metrics.NewDiskFree("strata_pageserver_disk_free_bytes",
		"Bytes free on the data folder's filesystem (read at each scrape): alert before writes fail with 'pageserver disk full'.", cfg.DataDir, nil))
	deps := pageserver.Deps{Log: log, Registry: reg, Store: o.Store}
	if cfg.ImagePolicy != "writeback" {
		// WAL deltas need the Go redo engine to be materialized.
		deps.Redo = walingest.Redo{Engine: postgres.NewEngine(postgres.Options{})}
	}
	var gated []pg.TimelineID
	if !o.FilesTimeline.IsZero() {
		switch {
		case len(o.Safekeepers) == 0:
			return fmt.Errorf("%w: a files timeline (redo mode) needs the safekeepers", pageserver.ErrConfig)
		case cfg.ImagePolicy == "writeback":
			return fmt.Errorf("%w: redo mode (a files timeline) needs image_policy fpi or pushdown, not writeback: pages come from WAL ingest", pageserver.ErrConfig)
		}
		gated = []pg.TimelineID{o.FilesTimeline}
	}
	var link *sklink.Link
	if len(o.Safekeepers) > 0 {
		var err error
		link, err = sklink.New(sklink.Config{Safekeepers: o.Safekeepers, Timeline: o.Timeline, Gated: gated, FastPoll: o.SafekeeperPoll},
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
	// A graceful stop (SIGTERM: strata down) publishes everything before
	// the timelines close, once ingest has stopped (the link's defer runs
	// first).
	graceful := false
	defer func() {
		if graceful {
			publishAll(ps, o.Store, log, publishLimit)
		}
	}()
	// Before the link starts: ingest must not see the timeline half
	// imported.
	var markDone func(context.Context)
	if o.BootstrapFrom != "" {
		if o.Timeline.IsZero() {
			err = fmt.Errorf("%w: bootstrap needs a timeline", ErrBootstrap)
		} else {
			markDone, err = bootstrap(ctx, ps, o)
		}
		if err != nil {
			if link != nil {
				link.Close()
			}
			return err
		}
	}
	if markDone != nil {
		mctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { markDone(mctx); close(done) }()
		defer func() { stop(); <-done }()
	}
	if link != nil {
		lctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = link.Run(lctx, ps); close(done) }()
		// Runs before ps.Close: the link stops using the timelines first.
		defer func() { stop(); <-done; link.Close() }()
		ev := log.Info().Stringer("timeline", o.Timeline).Strs("safekeepers", o.Safekeepers).Str("image_policy", cfg.ImagePolicy)
		if len(gated) > 0 {
			ev = ev.Stringer("files_timeline", o.FilesTimeline).Str("page_source", "redo")
		}
		ev.Msg("timeline bound to the safekeepers")
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
		graceful = true
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

// publishLimit bounds publishAll: within `strata down`'s 30 s for the
// pageserver, with room for the rest of the stop. storeProbeLimit bounds
// the question publishAll asks the store first.
const (
	publishLimit    = 20 * time.Second
	storeProbeLimit = 3 * time.Second
)

// publishAll flushes every timeline's in-memory layers and uploads every
// layer and the manifest, so that the object store alone holds the
// timelines and a pageserver can start on an empty folder from it. What
// does not make it within limit stays in the local folder, which the next
// start uses as always.
//
// The store is first asked one cheap question (storeProbeLimit): if it
// does not answer, the publish would only wait out its limit, and `strata
// down` in an outage would take that much longer; the flush to local
// layers still runs.
func publishAll(ps *pageserver.Pageserver, store objectstore.Store, log zerolog.Logger, limit time.Duration) {
	start := time.Now()
	tls := ps.Timelines()
	if err := ping(store, storeProbeLimit); err != nil {
		for _, tl := range tls {
			ctx, cancel := context.WithTimeout(context.Background(), limit)
			if err := tl.Flush(ctx); err != nil {
				log.Warn().Err(err).Stringer("timeline", tl.ID()).Msg("flushing the timeline at shutdown")
			}
			cancel()
		}
		log.Warn().Err(err).Int("timelines", len(tls)).
			Msg("timelines not published to the object store at shutdown: the store does not answer; the local folder holds everything, and the next start uploads it")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	ok := true
	for _, tl := range tls {
		if err := tl.Publish(ctx); err != nil {
			ok = false
			log.Warn().Err(err).Stringer("timeline", tl.ID()).Msg("timeline not wholly published to the object store at shutdown; the local folder holds the rest")
		}
	}
	if ok {
		log.Info().Dur("took", time.Since(start)).Int("timelines", len(tls)).Msg("every timeline published to the object store")
	}
}

// ping is objectstore.Ping within limit; no store answers.
func ping(store objectstore.Store, limit time.Duration) error {
	if store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	return objectstore.Ping(ctx, store)
}
