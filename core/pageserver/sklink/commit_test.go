package sklink

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/core/safekeeper/election"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/pg"
)

func TestQuorum(t *testing.T) {
	up := func(term uint64, acc bool, flush, commit pg.LSN) Peer {
		return Peer{Up: true, Term: term, Accepted: acc, Flush: flush, Commit: commit}
	}
	down := Peer{Up: false, Term: 9, Accepted: true, Flush: 9000, Commit: 9000}
	for _, c := range []struct {
		name  string
		peers []Peer
		n     int
		want  pg.LSN
	}{
		{"second highest flush of three", []Peer{up(0, false, 100, 10), up(0, false, 300, 10), up(0, false, 200, 10)}, 3, 200},
		{"a reported commit above the flush quorum", []Peer{up(0, false, 100, 250), up(0, false, 300, 10), down}, 3, 250},
		{"one up of three: only its commit", []Peer{up(0, false, 500, 40), down, down}, 3, 40},
		{"down peers never count", []Peer{down, down, up(0, false, 7, 7)}, 3, 7},
		{"a voted, not accepted term blocks its flush", []Peer{up(2, false, 900, 100), up(2, true, 800, 100), up(1, true, 850, 100)}, 3, 100},
		{"accepted in the highest term", []Peer{up(2, true, 900, 100), up(2, true, 800, 100), up(1, true, 1000, 100)}, 3, 800},
		{"older terms do not join the quorum", []Peer{up(2, true, 900, 100), up(1, true, 950, 100), up(1, true, 990, 100)}, 3, 100},
		{"a lone safekeeper", []Peer{up(0, false, 70, 0)}, 1, 70},
		{"five: the third highest", []Peer{up(0, false, 1, 0), up(0, false, 5, 0), up(0, false, 4, 0), up(0, false, 2, 0), up(0, false, 3, 0)}, 5, 3},
	} {
		if got := Quorum(c.peers, c.n); got != c.want {
			t.Errorf("%s: Quorum = %s, want %s", c.name, got, c.want)
		}
	}
}

// fakeSK is a safekeeper whose status the test sets; only Status is served.
type fakeSK struct {
	mu    sync.Mutex
	st    server.Status
	addr  string
	g     *grpc.Server
	calls atomic.Int64 // Status calls served
}

func (f *fakeSK) Status() server.Status {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.st
}
func (f *fakeSK) set(fn func(s *server.Status)) { f.mu.Lock(); fn(&f.st); f.mu.Unlock() }
func (f *fakeSK) Vote(context.Context, election.VoteRequest) (election.VoteResponse, error) {
	return election.VoteResponse{}, nil
}
func (f *fakeSK) Accept(context.Context, election.AcceptRequest, string) (pg.LSN, error) {
	return 0, nil
}
func (f *fakeSK) Store() *walstore.Store                       { return nil }
func (f *fakeSK) CommitLSN() pg.LSN                            { return f.Status().CommitLSN }
func (f *fakeSK) CommitNotify() <-chan struct{}                { return make(chan struct{}) }
func (f *fakeSK) Feedback(consumer string, fb server.Feedback) {}
func (f *fakeSK) Sent(n int)                                   {}

func (f *fakeSK) serve(t *testing.T) {
	t.Helper()
	addr := f.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var lis net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port of a stopped server may linger
		if lis, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	f.addr = lis.Addr().String()
	f.g = grpc.NewServer()
	server.Register(f.g, f)
	go f.g.Serve(lis)
}

func (f *fakeSK) stop() { f.g.Stop() }

func waitLSN(t *testing.T, c *Commit, want pg.LSN, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for c.CommitLSN() != want {
		if time.Since(start) > d {
			t.Fatalf("commit LSN %s, want %s (peers %+v)", c.CommitLSN(), want, c.Peers())
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

// TestCommitFollowsGroup runs the poller against three fake safekeepers:
// the quorum's flush LSN, monotonic when a safekeeper goes down, the
// safekeeper's return with backoff, the hooks and the metrics.
func TestCommitFollowsGroup(t *testing.T) {
	sks := []*fakeSK{{}, {}, {}}
	var addrs []string
	for i, s := range sks {
		s.st = server.Status{ID: "sk" + string(rune('1'+i)), FlushLSN: pg.LSN(100 * (i + 1)), CommitLSN: 50}
		s.serve(t)
		defer s.stop()
		addrs = append(addrs, s.addr)
	}
	reg := prometheus.NewRegistry()
	id := pg.TimelineID{7}
	c, err := NewCommit(Config{Safekeepers: addrs, Timeline: id, FastPoll: time.Millisecond, SlowPoll: 30 * time.Millisecond, MaxBackoff: 200 * time.Millisecond}, zerolog.Nop(), reg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var advanced []pg.LSN
	var waiting bool
	c.SetHooks(Hooks{
		Advanced: func(l pg.LSN) { mu.Lock(); advanced = append(advanced, l); mu.Unlock() },
		Waiting:  func() bool { mu.Lock(); defer mu.Unlock(); return waiting },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; c.Close() }()

	waitLSN(t, c, 200, 5*time.Second) // flushes 100, 200, 300: two hold 200
	sks[2].stop()
	sks[0].set(func(s *server.Status) { s.FlushLSN = 150 })
	time.Sleep(150 * time.Millisecond)
	if got := c.CommitLSN(); got != 200 {
		t.Fatalf("commit LSN went to %s with a safekeeper down; it must stay at 200", got)
	}
	sks[0].set(func(s *server.Status) { s.FlushLSN = 350 })
	sks[1].set(func(s *server.Status) { s.FlushLSN = 400 })
	waitLSN(t, c, 350, 5*time.Second)
	if n := testutil.ToFloat64(c.m.errors.WithLabelValues(addrs[2])); n < 1 {
		t.Fatalf("link errors of the stopped safekeeper: %v", n)
	}
	if v := testutil.ToFloat64(c.m.up.WithLabelValues(addrs[2])); v != 0 {
		t.Fatalf("up gauge of the stopped safekeeper: %v", v)
	}
	// It comes back on the same address, ahead of the others.
	sks[2].set(func(s *server.Status) { s.FlushLSN = 600 })
	sks[2].serve(t)
	waitLSN(t, c, 400, 10*time.Second)
	if v := testutil.ToFloat64(c.m.commit); v != 400 {
		t.Fatalf("commit gauge %v", v)
	}
	if v := testutil.ToFloat64(c.m.lag); v != 200 {
		t.Fatalf("lag gauge %v, want 600-400", v)
	}
	mu.Lock()
	adv := append([]pg.LSN(nil), advanced...)
	mu.Unlock()
	if len(adv) < 3 || adv[len(adv)-1] != 400 {
		t.Fatalf("Advanced calls %v", adv)
	}
	for i := 1; i < len(adv); i++ {
		if adv[i] <= adv[i-1] {
			t.Fatalf("Advanced not increasing: %v", adv)
		}
	}

	// While versions wait the pollers keep looking (how fast:
	// TestCommitFastPollSeesFlush); otherwise a Kick wakes the slow ones.
	mu.Lock()
	waiting = true
	mu.Unlock()
	time.Sleep(50 * time.Millisecond) // let the pollers leave their slow sleep
	for _, s := range sks {
		s.set(func(s *server.Status) { s.FlushLSN = 700 })
	}
	waitLSN(t, c, 700, 5*time.Second)
	mu.Lock()
	waiting = false
	mu.Unlock()
	time.Sleep(50 * time.Millisecond)
	for _, s := range sks {
		s.set(func(s *server.Status) { s.FlushLSN = 800 })
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := c.Wait(ctx2, 800); err != nil {
		t.Fatalf("Wait: %v", err)
	}
}

// TestCommitFastPollSeesFlush: while versions wait for the commit LSN the
// pollers keep looking without further kicks, so a new flush on the
// quorum is seen at once; with an hour-long slow poll, a second is far
// more than the fast and stalled polls need and far less than the slow one.
func TestCommitFastPollSeesFlush(t *testing.T) {
	var addrs []string
	var sks []*fakeSK
	for i := 0; i < 3; i++ {
		s := &fakeSK{st: server.Status{ID: "sk" + string(rune('1'+i)), FlushLSN: 10}}
		s.serve(t)
		defer s.stop()
		sks = append(sks, s)
		addrs = append(addrs, s.addr)
	}
	c, err := NewCommit(Config{Safekeepers: addrs, Timeline: pg.TimelineID{1}, FastPoll: time.Millisecond, SlowPoll: time.Hour}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var waiting atomic.Bool
	c.SetHooks(Hooks{Waiting: waiting.Load})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; c.Close() }()
	waitLSN(t, c, 10, 5*time.Second)
	waiting.Store(true)
	c.Kick() // what the pageserver does when a write leaves versions pending
	for i, lsn := range []pg.LSN{20, 30, 40} {
		time.Sleep(150 * time.Millisecond) // past StallAfter (100 ms): the pollers look every StalledPoll by then
		for _, s := range sks {
			s.set(func(st *server.Status) { st.FlushLSN = lsn })
		}
		start := time.Now()
		for c.CommitLSN() != lsn {
			if time.Since(start) > time.Second {
				t.Fatalf("flush %d: commit LSN %s a second after the quorum flushed %s, with versions waiting", i, c.CommitLSN(), lsn)
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("flush %d seen after %s", i, time.Since(start).Round(time.Microsecond))
	}
}

// TestCommitSlowPollKick: with a long slow poll, Kick (what the pageserver
// calls when a write leaves versions pending) makes the pollers look now.
func TestCommitSlowPollKick(t *testing.T) {
	s := &fakeSK{st: server.Status{FlushLSN: 10}}
	s.serve(t)
	defer s.stop()
	c, err := NewCommit(Config{Safekeepers: []string{s.addr}, Timeline: pg.TimelineID{1}, SlowPoll: time.Hour}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan bool, 1)
	waiting <- false
	c.SetHooks(Hooks{Waiting: func() bool { v := <-waiting; waiting <- v; return v }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; c.Close() }()
	waitLSN(t, c, 10, 5*time.Second)
	time.Sleep(20 * time.Millisecond)
	s.set(func(st *server.Status) { st.FlushLSN = 20 })
	time.Sleep(50 * time.Millisecond)
	if c.CommitLSN() != 10 {
		t.Fatalf("the slow poller looked without a kick: %s", c.CommitLSN())
	}
	<-waiting
	waiting <- true
	c.Kick()
	waitLSN(t, c, 20, 2*time.Second)
}

// TestCommitStalledPoll: while versions wait and the commit LSN does not
// move (initdb on a new compute, a group without a quorum), the pollers
// slow down from FastPoll to StalledPoll after StallAfter; the first
// advance brings FastPoll back.
func TestCommitStalledPoll(t *testing.T) {
	s := &fakeSK{st: server.Status{FlushLSN: 10}}
	s.serve(t)
	defer s.stop()
	c, err := NewCommit(Config{Safekeepers: []string{s.addr}, Timeline: pg.TimelineID{1},
		FastPoll: time.Millisecond, SlowPoll: time.Hour, StalledPoll: 300 * time.Millisecond, StallAfter: 400 * time.Millisecond}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.SetHooks(Hooks{Waiting: func() bool { return true }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; c.Close() }()
	waitLSN(t, c, 10, 5*time.Second)
	time.Sleep(800 * time.Millisecond) // past StallAfter and one stalled sleep
	n0 := s.calls.Load()
	time.Sleep(time.Second)
	stalled := s.calls.Load() - n0
	// FastPoll would be up to 1,000 calls; StalledPoll about 3.
	if stalled > 10 {
		t.Fatalf("%d status calls in 1 s with the commit LSN stalled: the pollers did not slow down", stalled)
	}
	s.set(func(st *server.Status) { st.FlushLSN = 20 })
	waitLSN(t, c, 20, 5*time.Second)
	time.Sleep(time.Millisecond)
	n1 := s.calls.Load()
	// Shorter than StallAfter; StalledPoll would make one call in it,
	// FastPoll up to 250.
	time.Sleep(250 * time.Millisecond)
	fast := s.calls.Load() - n1
	if fast < 5 {
		t.Fatalf("%d status calls in the 250 ms after the commit LSN moved: FastPoll did not come back", fast)
	}
	t.Logf("status calls: %d in 1 s stalled, %d in 250 ms after the advance", stalled, fast)
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{Safekeepers: []string{"a:1"}},
		{Safekeepers: []string{"a:1", "a:1"}, Timeline: pg.TimelineID{1}},
		{Safekeepers: []string{""}, Timeline: pg.TimelineID{1}},
	} {
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
	if err := (Config{Safekeepers: []string{"a:1", "b:1"}, Timeline: pg.TimelineID{1}}).Validate(); err != nil {
		t.Fatal(err)
	}
}
