package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/server"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/pageserver/walingest"
	"github.com/stratadb/strata/core/postgres"
	"github.com/stratadb/strata/core/restore"
	redopg "github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// StoreTimelines names the timelines for RestoreFromStore; empty fields
// are read from the cluster's folder when it still has them.
type StoreTimelines struct {
	Timeline, FilesTimeline string
}

// RestoreFromStore is Restore from the object store alone: for a cluster
// whose machine or data folder is lost, or that is stopped. A pageserver
// is opened in this process on an empty temporary folder over the store,
// read-only (it can publish nothing: a running cluster's pageserver is
// never fenced by it), and the WAL comes from the archive. The newest
// moment it reaches is the end of the archived WAL (whole segments, and
// the partial copy of the last one that the safekeepers upload after a
// quiet while, and as they stop): past the store's newest manifest, which
// after a crash may be minutes older, Postgres replays the archived WAL
// over the pages as of that manifest.
func (c *Cluster) RestoreFromStore(ctx context.Context, at restore.Target, dir string, port int, names StoreTimelines, progress func(string)) (_ *Restored, err error) {
	abs, port, err := c.restoreDest(dir, port)
	if err != nil {
		return nil, err
	}
	store, err := objstore.Open(ctx, c.cfg.ObjectStore, c.log, nil)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	ro := &goneWatch{Store: objectstore.ReadOnly(store)}
	defer func() {
		if err != nil && ro.gone.Load() {
			err = fmt.Errorf("%w\n(is a cluster running on this object store? Its pageserver replaces layers as it compacts and collects them: restore from that cluster without --from-store, or stop it first)", err)
		}
	}()

	tmp, err := os.MkdirTemp("", "strata-restore-pageserver-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	progress("opening the object store's timelines (read-only pageserver in " + tmp + ")")
	pcfg := pageserver.DefaultConfig()
	pcfg.DataDir = tmp
	pcfg.MetricsAddr = "" // the gRPC listener is this process's own, below
	// No GC: the history the store holds is all there is.
	pcfg.PITR, pcfg.GCHorizon = time.Duration(math.MaxInt64), math.MaxUint64/2
	pcfg.ImagePolicy = c.cfg.Storage.ImagePolicy
	// A redo-mode timeline's pages are rebuilt from its delta records.
	redoEngine := walingest.Redo{Engine: redopg.NewEngine(redopg.Options{})}
	ps, err := pageserver.New(ctx, pcfg, pageserver.Deps{Log: c.log.Level(zerolog.WarnLevel), Registry: prometheus.NewRegistry(), Store: ro, Redo: redoEngine})
	if err != nil {
		return nil, fmt.Errorf("restore: opening the object store's timelines: %w", err)
	}
	defer ps.Close()
	tl, filesTL, err := c.storeTimelines(ctx, ps, names)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(256 << 20))
	server.New(ps, c.log.Level(zerolog.WarnLevel), nil).Register(g)
	go g.Serve(lis)
	defer g.Stop()
	cl, err := client.Dial(lis.Addr().String())
	if err != nil {
		return nil, err
	}
	defer cl.Close()

	// The newest moment: the store's manifest, and the archived WAL.
	t, err := ps.Timeline(filesTL)
	if err != nil {
		return nil, err
	}
	remote := t.LSNs().RemoteConsistent
	if filesTL != tl {
		// Redo mode: the pages are only as new as the redo timeline's
		// ingest that reached the store.
		rt, err := ps.Timeline(tl)
		if err != nil {
			return nil, err
		}
		remote = min(remote, rt.LSNs().RemoteConsistent)
	}
	ctl, err := t.ReadFile(ctx, restore.ControlFile, timeline.LatestLSN)
	if err != nil {
		return nil, fmt.Errorf("restore: timeline %s has no %s in the object store: %w", filesTL, restore.ControlFile, err)
	}
	c0, err := agent.ParseControl(ctl)
	if err != nil {
		return nil, err
	}
	walEnd, err := archivedEnd(ctx, store, "wal", c0.SystemID)
	if err != nil {
		return nil, err
	}
	progress(fmt.Sprintf("timeline %s: pages in the object store up to %s, WAL archived up to %s", tl, remote, walEnd))
	if at.Latest && remote > walEnd {
		progress(fmt.Sprintf("the pages reach %s, past the archived WAL: the copy ends at %s; commits in between are not in the object store (the safekeepers archive all of it as they stop with strata down; after a crash, whole segments, and the last partial one every minute and after 10 s without commits)", remote, walEnd))
	}
	if remote == 0 || walEnd == 0 {
		return nil, fmt.Errorf("restore: timeline %s: nothing to restore (pages up to %s, WAL archived up to %s)", tl, remote, walEnd)
	}
	redo := filesTL != tl
	res, err := restore.Run(ctx, restore.Options{
		Pageserver: cl, Timeline: tl, FilesTimeline: filesTL, Redo: redo,
		// Past the pages the store holds (the pageserver uploads them
		// every few minutes), Postgres replays the archived WAL.
		End: walEnd, PagesEnd: remote,
		WAL:      agent.WALSource{Archive: store, Prefix: "wal"},
		Postgres: postgres.Server{BinDir: c.cfg.Compute.PGBinDir, OSUser: c.cfg.Compute.OSUser},
		Dir:      abs, Port: port, At: at, Progress: progress, Log: c.log,
	})
	if err != nil {
		return nil, err
	}
	return c.restored(res, abs, port), nil
}

// storeTimelines picks the timelines to restore: the ones named, else the
// cluster folder's, else the store's only root timeline (or its only two,
// when one holds relations and the other none: a redo-mode cluster's redo
// and files timelines).
func (c *Cluster) storeTimelines(ctx context.Context, ps *pageserver.Pageserver, names StoreTimelines) (tl, filesTL pg.TimelineID, err error) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(c.dataDir, name))
		if err != nil {
			return ""
		}
		return strings.TrimSpace(string(b))
	}
	if names.Timeline == "" {
		names.Timeline, names.FilesTimeline = read("timeline"), read("files-timeline")
	}
	var roots []string
	var withRels, noRels []string
	for _, t := range ps.Timelines() {
		if a, _ := t.Ancestor(); a != nil {
			continue
		}
		roots = append(roots, t.ID().String())
		rels, err := t.ListRels(ctx, keyspace.RelsRange, timeline.LatestLSN)
		if err != nil {
			return tl, filesTL, fmt.Errorf("restore: timeline %s: %w", t.ID(), err)
		}
		if len(rels) > 0 {
			withRels = append(withRels, t.ID().String())
		} else {
			noRels = append(noRels, t.ID().String())
		}
	}
	if names.Timeline == "" {
		switch {
		case len(roots) == 0:
			return tl, filesTL, errors.New("restore: the object store holds no timeline")
		case len(roots) == 1:
			names.Timeline = roots[0]
		case len(roots) == 2 && len(withRels) == 1:
			// A redo-mode cluster: the redo timeline holds the relation
			// pages, the files timeline none.
			names.Timeline, names.FilesTimeline = withRels[0], noRels[0]
		default:
			return tl, filesTL, fmt.Errorf("restore: the object store holds %d timelines (%s): say which with --timeline (in redo mode also --files-timeline)", len(roots), strings.Join(roots, ", "))
		}
	}
	if tl, err = pg.ParseTimelineID(names.Timeline); err != nil {
		return tl, filesTL, fmt.Errorf("restore: timeline %q: %w", names.Timeline, err)
	}
	filesTL = tl
	if names.FilesTimeline != "" {
		if filesTL, err = pg.ParseTimelineID(names.FilesTimeline); err != nil {
			return tl, filesTL, fmt.Errorf("restore: files timeline %q: %w", names.FilesTimeline, err)
		}
	}
	for _, id := range []pg.TimelineID{tl, filesTL} {
		if _, err := ps.Timeline(id); err != nil {
			return tl, filesTL, fmt.Errorf("restore: the object store has no timeline %s (it holds %s)", id, strings.Join(roots, ", "))
		}
	}
	return tl, filesTL, nil
}

// archivedEnd returns the end of the WAL archived for system id: the end
// of the last whole segment, or of the partial copy after it (the keys
// are archive.Key's: <prefix>/<system id>/<segment>[.partial]).
func archivedEnd(ctx context.Context, store objectstore.Store, prefix string, systemID uint64) (pg.LSN, error) {
	p := fmt.Sprintf("%s/%d/", prefix, systemID)
	var end pg.LSN
	err := store.List(ctx, p, func(oi objectstore.ObjectInfo) error {
		name, partial := strings.CutSuffix(oi.Key[len(p):], ".partial")
		s, err := walpos.ParseSegmentName(name, pg.WALSegmentSize)
		if err != nil {
			return nil
		}
		e := pg.LSN((s.SegNo + 1) * pg.WALSegmentSize)
		if partial {
			e = pg.LSN(s.SegNo*pg.WALSegmentSize) + pg.LSN(oi.Size)
		}
		end = max(end, e)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("restore: listing the archived WAL: %w", err)
	}
	return end, nil
}

// goneWatch notes that a layer object was not in the store: the read-only
// pageserver opened the newest manifest, and a pageserver still writing
// to the store may since have replaced the layers it names.
type goneWatch struct {
	objectstore.Store
	gone atomic.Bool
}

func (g *goneWatch) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := g.Store.Get(ctx, key)
	if errors.Is(err, objectstore.ErrNotFound) && strings.Contains(key, "/layers/") {
		g.gone.Store(true)
	}
	return rc, err
}
