package safekeeper

import (
	"bytes"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	pb "github.com/stratadb/strata/core/safekeeper/safekeeperpb"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
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

// TestPeerPollFollowsReaders: under a steady commit load a safekeeper
// polls its peers about once a second while nobody reads committed WAL
// from it (writeback mode: the pageserver computes the commit LSN from the
// flush LSNs itself), and at the busy rate once a reader waits for the
// commit LSN (a BOUND_COMMIT stream): a round per flush, and every 50 ms
// while flushed WAL is not known committed, so about a round per commit
// of the one-client load. The reader then receives WAL up to the end of
// Postgres' WAL promptly.
func TestPeerPollFollowsReaders(t *testing.T) {
	c := startCluster(t)
	waitSync(t, c.srv, 3)
	c.srv.Exec("postgres", "CREATE TABLE load (id serial PRIMARY KEY, v text)")
	ctx, cancel := context.WithCancel(context.Background())
	loadDone := make(chan struct{})
	var commits atomic.Int64
	go func() {
		defer close(loadDone)
		for ctx.Err() == nil {
			c.srv.Exec("postgres", "INSERT INTO load (v) SELECT 'x' FROM generate_series(1, 10)")
			commits.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-loadDone }()
	n := c.nodes[0]
	rounds := func() float64 { return testutil.ToFloat64(n.m.peerPolls) }
	window := 3 * time.Second
	time.Sleep(time.Second) // past the start
	r0, c0 := rounds(), commits.Load()
	time.Sleep(window)
	idle, idleCommits := rounds()-r0, commits.Load()-c0
	if idle > 8 {
		t.Errorf("%v peer poll rounds in %s of load (%d commits) with no reader of committed WAL, want about 3", idle, window, idleCommits)
	}

	cl, err := server.Dial(c.cfgs[0].ListenAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	cons, err := cl.Consume(ctx, "test", n.Store().StartLSN())
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var got atomic.Uint64 // end of the WAL received
	go func() {
		for {
			ch, err := cons.Recv()
			if err != nil {
				return
			}
			got.Store(uint64(ch.Start) + uint64(len(ch.Data)))
		}
	}()
	time.Sleep(time.Second)
	r0, c0 = rounds(), commits.Load()
	time.Sleep(window)
	busy, busyCommits := rounds()-r0, commits.Load()-c0
	// Each commit flushes WAL that a round must then find committed; on a
	// loaded machine there are fewer commits, and so fewer rounds.
	if want := min(20, float64(busyCommits)*3/4); busy < want {
		t.Errorf("%v peer poll rounds in %s of load (%d commits) with a reader waiting for the commit LSN, want %v or more (a round per flush, every 50 ms while one is not known committed)",
			busy, window, busyCommits, want)
	}
	end := testpg.FlushLSN(t, c.srv)
	start := time.Now()
	testpg.WaitFor(t, 10*time.Second, "the reader at Postgres' flush LSN", func() bool { return pg.LSN(got.Load()) >= end })
	t.Logf("peer poll rounds in %s: %v without a reader (%d commits), %v with one (%d commits); the reader reached %s %s after it was Postgres' flush LSN",
		window, idle, idleCommits, busy, busyCommits, end, time.Since(start).Round(time.Millisecond))
}

// TestFetchTailPastTrailingCommit: with no reader waiting for committed WAL
// a safekeeper's own commit LSN trails the quorum by up to a poll interval;
// wal fetch of the last segment still returns every acknowledged commit, at
// once (it asks for committed WAL up to the group's flush LSN, which wakes
// the safekeeper's peer poll).
func TestFetchTailPastTrailingCommit(t *testing.T) {
	c := startCluster(t)
	waitSync(t, c.srv, 3)
	c.srv.Exec("postgres", "CREATE TABLE load (id serial PRIMARY KEY, v text)")
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); {
		c.srv.Exec("postgres", "INSERT INTO load (v) SELECT 'x' FROM generate_series(1, 10)")
		time.Sleep(5 * time.Millisecond)
	}
	// The last commit is acknowledged: on two safekeepers at least.
	c.srv.Exec("postgres", "INSERT INTO load (v) VALUES ('last')")
	end := testpg.FlushLSN(t, c.srv)
	own := c.nodes[0].CommitLSN()
	var addrs []string
	for _, cfg := range c.cfgs {
		addrs = append(addrs, cfg.ListenAddr)
	}
	const seg = pg.WALSegmentSize
	segStart := pg.LSN(uint64(end-1) / seg * seg)
	name := walstore.SegmentName(1, uint64(segStart)/seg, seg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var buf bytes.Buffer
	start := time.Now()
	if err := FetchSegment(ctx, FetchOptions{Safekeepers: addrs}, name, &buf); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if buf.Len() != seg {
		t.Fatalf("fetched %d bytes, want a whole segment", buf.Len())
	}
	testpg.CompareBytes(t, c.srv, segStart, buf.Bytes()[:end-segStart], "fetched tail up to the last acknowledged commit")
	if took >= DefaultTailWait {
		t.Errorf("the fetch took %s: it waited out its tail wait", took)
	}
	t.Logf("last commit at %s; the first safekeeper's own commit LSN was %s; fetched through it in %s", end, own, took.Round(time.Millisecond))
}
