package cache

// The gRPC shim of the Advisor contract: an Advisor served by an external
// plugin process and used by the agent as a plain Advisor. Wire types
// (internal/cachepb) never leave this file.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/sdk/cache/internal/cachepb"
	"github.com/stratadb/strata/sdk/plugin"
)

const (
	// AdvisorPluginKind is the name a cache advisor plugin is dispensed under.
	AdvisorPluginKind = "cache-advisor"
	// AdvisorProtocolVersion is the version of internal/cachepb/advisor.proto.
	AdvisorProtocolVersion = 1
)

var errorMap = plugin.ErrorMap{
	{Code: codes.InvalidArgument, Sentinel: ErrBadSize},
	{Code: codes.FailedPrecondition, Sentinel: ErrClosed},
}

// AdvisorFactory opens the Advisor a plugin serves, from its config section
// (JSON; may be empty) and a logger the host forwards.
type AdvisorFactory func(configJSON []byte, log zerolog.Logger) (Advisor, error)

// ServeAdvisorPlugin is the whole main of a cache advisor plugin binary:
//
//	func main() { cache.ServeAdvisorPlugin(myFactory) }
func ServeAdvisorPlugin(factory AdvisorFactory) {
	plugin.Serve(plugin.ServeConfig{
		Kind:    AdvisorPluginKind,
		Version: AdvisorProtocolVersion,
		Plugin:  &AdvisorGRPCPlugin{Factory: factory, Log: plugin.Logger()},
	})
}

// AdvisorGRPCPlugin is the go-plugin glue. A plugin sets Factory and Log; a
// host leaves them zero and receives an *AdvisorGRPCClient.
type AdvisorGRPCPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
	Factory AdvisorFactory
	Log     zerolog.Logger
}

var _ goplugin.GRPCPlugin = (*AdvisorGRPCPlugin)(nil)

// GRPCServer registers the advisor service (plugin side).
func (p *AdvisorGRPCPlugin) GRPCServer(_ *goplugin.GRPCBroker, s *grpc.Server) error {
	if p.Factory == nil {
		return errors.New("cache: AdvisorGRPCPlugin.Factory is nil")
	}
	cachepb.RegisterCacheAdvisorServer(s, &advisorServer{factory: p.Factory, log: p.Log})
	return nil
}

// GRPCClient returns an *AdvisorGRPCClient over conn (host side).
func (p *AdvisorGRPCPlugin) GRPCClient(_ context.Context, _ *goplugin.GRPCBroker, conn *grpc.ClientConn) (any, error) {
	return NewAdvisorGRPCClient(conn), nil
}

type advisorServer struct {
	cachepb.UnimplementedCacheAdvisorServer
	factory AdvisorFactory
	log     zerolog.Logger

	mu sync.Mutex
	a  Advisor
}

func (s *advisorServer) Configure(_ context.Context, req *cachepb.ConfigureRequest) (*cachepb.ConfigureResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.a != nil {
		return nil, status.Error(codes.Internal, "cache advisor plugin: already configured")
	}
	a, err := s.factory(req.GetConfigJson(), s.log)
	if err != nil {
		return nil, status.Error(codes.Internal, "cache advisor plugin: opening the advisor: "+err.Error())
	}
	s.a = a
	return &cachepb.ConfigureResponse{}, nil
}

func (s *advisorServer) Advise(ctx context.Context, req *cachepb.AdviseRequest) (*cachepb.AdviseResponse, error) {
	s.mu.Lock()
	a := s.a
	s.mu.Unlock()
	if a == nil {
		return nil, status.Error(codes.Internal, "cache advisor plugin: Configure was not called")
	}
	obs := Observation{
		Stats: statsFromProto(req.GetStats()), Prev: statsFromProto(req.GetPrev()),
		Period: time.Duration(req.GetPeriodNs()), BudgetBytes: req.GetBudgetBytes(),
	}
	for _, w := range req.GetWaits() {
		obs.Waits = append(obs.Waits, WaitStat{Name: w.GetName(), Count: w.GetCount(), Total: time.Duration(w.GetTotalNs())})
	}
	adv, err := a.Advise(ctx, obs)
	if err != nil {
		return nil, errorMap.ToStatus(err)
	}
	return &cachepb.AdviseResponse{Resize: adv.Resize, CapacityBytes: adv.CapacityBytes}, nil
}

// AdvisorGRPCClient is the host side: an Advisor whose decisions are made in
// a plugin process. It is safe for concurrent use.
type AdvisorGRPCClient struct{ rpc cachepb.CacheAdvisorClient }

var _ Advisor = (*AdvisorGRPCClient)(nil)

// NewAdvisorGRPCClient returns a client of the advisor service on conn.
func NewAdvisorGRPCClient(conn grpc.ClientConnInterface) *AdvisorGRPCClient {
	return &AdvisorGRPCClient{rpc: cachepb.NewCacheAdvisorClient(conn)}
}

// Configure passes the plugin its config section (JSON). Call it once, first.
func (c *AdvisorGRPCClient) Configure(ctx context.Context, configJSON []byte) error {
	_, err := c.rpc.Configure(ctx, &cachepb.ConfigureRequest{ConfigJson: configJSON})
	return errorMap.FromStatus(err)
}

// Advise implements Advisor.
func (c *AdvisorGRPCClient) Advise(ctx context.Context, obs Observation) (Advice, error) {
	req := &cachepb.AdviseRequest{
		Stats: statsToProto(obs.Stats), Prev: statsToProto(obs.Prev),
		PeriodNs: int64(obs.Period), BudgetBytes: obs.BudgetBytes,
	}
	for _, w := range obs.Waits {
		req.Waits = append(req.Waits, &cachepb.WaitStat{Name: w.Name, Count: w.Count, TotalNs: int64(w.Total)})
	}
	resp, err := c.rpc.Advise(ctx, req)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return Advice{}, fmt.Errorf("%w (%v)", cerr, errorMap.FromStatus(err))
		}
		return Advice{}, errorMap.FromStatus(err)
	}
	return Advice{Resize: resp.GetResize(), CapacityBytes: resp.GetCapacityBytes()}, nil
}

func statsToProto(s Stats) *cachepb.Stats {
	return &cachepb.Stats{Hits: s.Hits, Misses: s.Misses, Puts: s.Puts, StalePuts: s.StalePuts,
		Evictions: s.Evictions, Invalidations: s.Invalidations, Pages: s.Pages,
		UsedBytes: s.UsedBytes, CapacityBytes: s.CapacityBytes}
}

func statsFromProto(p *cachepb.Stats) Stats {
	return Stats{Hits: p.GetHits(), Misses: p.GetMisses(), Puts: p.GetPuts(), StalePuts: p.GetStalePuts(),
		Evictions: p.GetEvictions(), Invalidations: p.GetInvalidations(), Pages: p.GetPages(),
		UsedBytes: p.GetUsedBytes(), CapacityBytes: p.GetCapacityBytes()}
}
