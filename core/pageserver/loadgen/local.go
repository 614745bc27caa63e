package loadgen

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/server"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// LocalOptions configure an in-process pageserver.
type LocalOptions struct {
	Dir string // data directory (required)
	// CacheBytes bounds the page cache (0: the pageserver's default).
	CacheBytes int64
	// LayerTargetSize splits layer files (0: the default, 64 MiB). Small
	// layers make cold reads download less per miss.
	LayerTargetSize int64
	// Store is the object store (nil: an in-memory store).
	Store objectstore.Store
	// Evictable lets Evict delete uploaded layer files (MaxLocalBytes 1:
	// the background loop then also evicts every layer it uploaded).
	Evictable bool
}

// Local is a pageserver running in this process, serving gRPC on a free
// loopback port.
type Local struct {
	PS       *pageserver.Pageserver
	Addr     string
	Registry *prometheus.Registry
	g        *grpc.Server
}

// StartLocal starts a pageserver in o.Dir.
func StartLocal(ctx context.Context, o LocalOptions, log zerolog.Logger) (*Local, error) {
	if o.Dir == "" {
		return nil, errors.New("loadgen: LocalOptions.Dir is required")
	}
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = o.Dir
	cfg.ListenAddr = "127.0.0.1:0"
	cfg.MetricsAddr = ""
	cfg.WaitLSNTimeout = 5 * time.Second
	if o.CacheBytes > 0 {
		cfg.CacheBytes = o.CacheBytes
	}
	if o.LayerTargetSize > 0 {
		cfg.LayerTargetSize = o.LayerTargetSize
	}
	if o.Evictable {
		cfg.MaxLocalBytes = 1
	}
	store := o.Store
	if store == nil {
		store = objectstore.NewMemory()
	}
	reg := prometheus.NewRegistry()
	ps, err := pageserver.New(ctx, cfg, pageserver.Deps{Log: log, Registry: reg, Store: store})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		ps.Close()
		return nil, err
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(256 << 20))
	server.New(ps, log, reg).Register(g)
	go g.Serve(lis)
	return &Local{PS: ps, Addr: lis.Addr().String(), Registry: reg, g: g}, nil
}

// Flush writes the timeline's in-memory layer out as layer files, so that
// uncached reads go to local layer files.
func (l *Local) Flush(ctx context.Context, id pg.TimelineID) error {
	tl, err := l.PS.Timeline(id)
	if err != nil {
		return err
	}
	return tl.Flush(ctx)
}

// Evict flushes, uploads the timeline's layer files to the object store
// and deletes the local copies (LocalOptions.Evictable) until none is left
// (the background loop may compact meanwhile, making new local files). It
// returns the number of layer files; the next read of each downloads it.
func (l *Local) Evict(ctx context.Context, id pg.TimelineID) (int, error) {
	tl, err := l.PS.Timeline(id)
	if err != nil {
		return 0, err
	}
	for i := 0; i < 50; i++ {
		if err := tl.Publish(ctx); err != nil {
			return 0, err
		}
		tl.EvictCold()
		if tl.LocalBytes() == 0 {
			return len(tl.Layers()), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return 0, errors.New("loadgen: layer files stay local (LocalOptions.Evictable not set?)")
}

// Counter returns the current value of a counter metric of the pageserver
// (0 when absent), e.g. strata_pageserver_cache_hits_total.
func (l *Local) Counter(name string) float64 {
	mfs, err := l.Registry.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		v := 0.0
		for _, m := range mf.GetMetric() {
			if c := m.GetCounter(); c != nil {
				v += c.GetValue()
			}
		}
		return v
	}
	return 0
}

// Close stops the server and the pageserver.
func (l *Local) Close() error {
	l.g.Stop()
	return l.PS.Close()
}
