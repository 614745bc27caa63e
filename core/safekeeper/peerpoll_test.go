package safekeeper

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/stratadb/strata/core/safekeeper/safekeeperpb"
	"github.com/stratadb/strata/internal/pgtest"
)

// countingPeer answers Status like an idle safekeeper and counts the calls.
type countingPeer struct {
	pb.UnimplementedSafekeeperServer
	calls atomic.Int64
}

func (p *countingPeer) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	p.calls.Add(1)
	return &pb.StatusResponse{Id: "peer"}, nil
}

// TestPeerPollIdle: a safekeeper whose WAL is all committed (here: none)
// polls its peers about once a second, not every 50 ms; nothing in the
// peers' answers could move its commit LSN until it flushes more.
func TestPeerPollIdle(t *testing.T) {
	var peers []string
	var counters []*countingPeer
	for i := 0; i < 2; i++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		g := grpc.NewServer()
		p := &countingPeer{}
		pb.RegisterSafekeeperServer(g, p)
		go g.Serve(lis)
		t.Cleanup(g.Stop)
		peers = append(peers, lis.Addr().String())
		counters = append(counters, p)
	}
	cfg := DefaultConfig()
	cfg.ID = "sk1"
	cfg.DataDir = t.TempDir()
	cfg.ListenAddr = net.JoinHostPort("127.0.0.1", itoa(pgtest.FreePort(t)))
	cfg.Postgres = "postgres://nobody@127.0.0.1:1/postgres" // nothing to stream from
	cfg.Peers = peers
	n, err := New(cfg, Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); n.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(4 * time.Second)
	for i, p := range counters {
		// The busy rate would be 80 calls in 4 s.
		if c := p.calls.Load(); c < 2 || c > 10 {
			t.Errorf("peer %d answered %d status calls in 4 s of idling, want 2 to 10", i, c)
		}
	}
}
