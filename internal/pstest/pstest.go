// Package pstest serves a real pageserver over gRPC on a loopback address,
// for tests that need one they can stop and start again (a new
// incarnation on the same data).
package pstest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/server"
)

// Serve opens a pageserver with cfg and deps and serves its gRPC API on
// addr ("127.0.0.1:0": a free port). An address just released by a
// stopped server is retried for 5 s. It returns the address it listens on
// and stop, which stops the server and closes the pageserver. A nil
// deps.Registry gets a fresh one (a restart needs a fresh one too).
func Serve(t testing.TB, cfg pageserver.Config, deps pageserver.Deps, addr string) (string, func()) {
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
	return lis.Addr().String(), func() { g.Stop(); ps.Close() }
}
