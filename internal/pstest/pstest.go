// Package pstest serves a real pageserver over gRPC on a loopback address,
// for tests that need one they can stop and start again (a new
// incarnation on the same data), and stands in for the safekeepers'
// commit LSN for tests that mount a compute over it.
package pstest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/server"
	"github.com/stratadb/strata/sdk/pg"
)

// Serve opens a pageserver with cfg and deps and serves its gRPC API on
// addr ("127.0.0.1:0": a free port). An address just released by a
// stopped server is retried for 5 s. It returns the address it listens on
// and stop, which stops the server and closes the pageserver. A nil
// deps.Registry gets a fresh one (a restart needs a fresh one too).
func Serve(t testing.TB, cfg pageserver.Config, deps pageserver.Deps, addr string) (string, func()) {
	t.Helper()
	_, got, stop := serve(t, cfg, deps, addr)
	return got, stop
}

func serve(t testing.TB, cfg pageserver.Config, deps pageserver.Deps, addr string) (*pageserver.Pageserver, string, func()) {
	t.Helper()
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	ps, err := pageserver.New(context.Background(), cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	var lis net.Listener
	for i := 0; ; i++ {
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		if i > 50 {
			ps.Close()
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	g := grpc.NewServer(grpc.MaxRecvMsgSize(256 << 20))
	server.New(ps, deps.Log, deps.Registry).Register(g)
	go g.Serve(lis)
	return ps, lis.Addr().String(), func() { g.Stop(); ps.Close() }
}

// A Server is a pageserver served on a free loopback port and a client
// of it, both closed when the test ends.
type Server struct {
	PS     *pageserver.Pageserver
	Client *client.Client
	Addr   string
}

// Start opens a pageserver with cfg and deps (Serve), serves it on a free
// loopback port and dials it.
func Start(t testing.TB, cfg pageserver.Config, deps pageserver.Deps) *Server {
	t.Helper()
	ps, addr, stop := serve(t, cfg, deps, "127.0.0.1:0")
	c, err := client.Dial(addr)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		stop()
	})
	return &Server{PS: ps, Client: c, Addr: addr}
}

// FollowCommit stands in for the safekeepers of timeline id: every
// millisecond it advances the timeline's commit LSN on c to w() (for a
// compute's mount, the end of the WAL it has seen Postgres write) when
// that has moved. stop ends it and waits; an error fails the test and
// ends it too.
func FollowCommit(t testing.TB, c *client.Client, id pg.TimelineID, w func() pg.LSN) (stop func()) {
	stopc := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last pg.LSN
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopc:
				return
			case <-tick.C:
			}
			if l := w(); l > last {
				if err := c.AdvanceCommitLSN(context.Background(), id, l); err != nil {
					t.Errorf("advance commit LSN of %s: %v", id, err)
					return
				}
				last = l
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(stopc)
			wg.Wait()
		})
	}
}
