package sklink

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/sdk/pg"
)

// TestLinkReleasesGatedWrites binds a timeline of a real Pageserver to
// three fake safekeepers with a slow poll of an hour: a write above the
// commit LSN kicks the pollers (Deps.AfterWrite), the pollers then poll
// fast while it is pending, and as soon as two safekeepers report a flush
// at its W it becomes durable (Hooks.Advanced calls CommitAdvanced; the
// timeline's own tick, set to an hour, cannot release it). Another
// timeline keeps the settable commit LSN.
func TestLinkReleasesGatedWrites(t *testing.T) {
	sks := []*fakeSK{{}, {}, {}}
	var addrs []string
	for _, s := range sks {
		s.st = server.Status{FlushLSN: 100}
		s.serve(t)
		defer s.stop()
		addrs = append(addrs, s.addr)
	}
	bound, other := pg.TimelineID{0xB0}, pg.TimelineID{0x0B}
	l, err := New(Config{Safekeepers: addrs, Timeline: bound, SlowPoll: time.Hour, FastPoll: time.Millisecond}, Options{}, zerolog.Nop(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.BackgroundInterval = time.Hour // only the link can release the write
	ps, err := pageserver.New(context.Background(), cfg, l.Deps(pageserver.Deps{Log: zerolog.Nop()}))
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx, ps); close(done) }()
	defer func() { cancel(); <-done; l.Close() }()
	tl, err := ps.CreateTimeline(ctx, bound)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.CreateTimeline(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitLSN(t, l.Commit, 100, 5*time.Second)
	rel := pg.RelTag{Spc: 1663, DB: 1, Rel: 2}
	data := bytes.Repeat([]byte{7}, pg.BlockSize)
	err = ps.Mutate(bound, 0, func(tl *timeline.Timeline) error {
		_, err := tl.PutPages(ctx, []timeline.PageWrite{{Page: rel.Page(0), W: 500, Data: data}})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := tl.LSNs(); l.Pending == 0 || l.Durable >= 500 {
		t.Fatalf("write above the commit LSN is not pending: %+v", l)
	}
	time.Sleep(20 * time.Millisecond)
	sks[0].set(func(s *server.Status) { s.FlushLSN = 600 })
	sks[2].set(func(s *server.Status) { s.FlushLSN = 550 })
	start := time.Now()
	for tl.LSNs().Durable < 500 {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("not durable %v after the quorum flushed past W: %+v (commit %s)", time.Since(start), tl.LSNs(), l.Commit.CommitLSN())
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("durable %v after two safekeepers reported the flush", time.Since(start))
	if c := l.Commit.CommitLSN(); c != 550 {
		t.Fatalf("commit LSN %s, want 550", c)
	}
	// The other timeline is not bound: AdvanceCommitLSN works there only.
	if err := ps.AdvanceCommitLSN(other, 10); err != nil {
		t.Fatal(err)
	}
	if err := ps.AdvanceCommitLSN(bound, 10); err == nil {
		t.Fatal("AdvanceCommitLSN accepted on the bound timeline")
	}
}

// TestStallCheck: a WAL stream that ingested nothing for a check is opened
// again when the commit LSN is ahead: always for a gap of more than a WAL
// page, once per gap for a smaller one (a stopped Postgres leaves only its
// shutdown checkpoint record behind, a few dozen bytes: the check ignored
// it, and a hung stream kept ingest short of it for good).
func TestStallCheck(t *testing.T) {
	var s stallCheck
	for i, c := range []struct {
		last, cur, commit pg.LSN
		want              bool
	}{
		{100, 200, 9000, false},       // progress
		{200, 200, 200, false},        // caught up
		{200, 200, 100, false},        // commit behind (a restart)
		{200, 200, 200 + 9000, true},  // more than a page behind
		{200, 200, 200 + 9000, true},  // ... every time
		{300, 300, 300 + 114, true},   // a small gap: once
		{300, 300, 300 + 114, false},  // not again for the same gap
		{300, 300, 300 + 200, true},   // the commit LSN moved: a new gap
		{500, 500, 500 + 8192, true},  // exactly a page: small, first time
		{500, 500, 500 + 8192, false}, // ... once
	} {
		if got := s.reopen(c.last, c.cur, c.commit); got != c.want {
			t.Errorf("check %d (last %d, ingested %d, commit %d): reopen %v, want %v", i, c.last, c.cur, c.commit, got, c.want)
		}
	}
}
