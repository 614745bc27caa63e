package sklink

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/sdk/pg"
)

// TestLinkGatedTimeline: a timeline in Config.Gated (redo mode's files
// timeline) takes the group's commit LSN like the bound one: a write
// above it is pending until a quorum flushed past its W, and
// AdvanceCommitLSN is refused there; a bad Gated list is a config error.
func TestLinkGatedTimeline(t *testing.T) {
	sks := []*fakeSK{{}, {}, {}}
	var addrs []string
	for _, s := range sks {
		s.st = server.Status{FlushLSN: 100}
		s.serve(t)
		defer s.stop()
		addrs = append(addrs, s.addr)
	}
	bound, files := pg.TimelineID{0xB1}, pg.TimelineID{0xF1}
	for _, bad := range [][]pg.TimelineID{{{}}, {bound}} {
		if _, err := New(Config{Safekeepers: addrs, Timeline: bound, Gated: bad}, Options{}, zerolog.Nop(), nil); !errors.Is(err, ErrConfig) {
			t.Fatalf("Gated %v: %v, want ErrConfig", bad, err)
		}
	}
	l, err := New(Config{Safekeepers: addrs, Timeline: bound, Gated: []pg.TimelineID{files}, SlowPoll: time.Hour, FastPoll: time.Millisecond}, Options{}, zerolog.Nop(), nil)
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
	tl, err := ps.CreateTimeline(ctx, files)
	if err != nil {
		t.Fatal(err)
	}
	waitLSN(t, l.Commit, 100, 5*time.Second)
	err = ps.Mutate(files, 0, func(tl *timeline.Timeline) error {
		return tl.WriteFile(ctx, "global/pg_control", 0, bytes.Repeat([]byte{1}, 512), 500)
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := tl.LSNs(); l.Pending == 0 || l.Durable >= 500 {
		t.Fatalf("a write above the commit LSN is not pending on the gated timeline: %+v", l)
	}
	sks[0].set(func(s *server.Status) { s.FlushLSN = 600 })
	sks[1].set(func(s *server.Status) { s.FlushLSN = 600 })
	for start := time.Now(); tl.LSNs().Durable < 500; time.Sleep(time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("gated write not durable after the quorum flushed past W: %+v (commit %s)", tl.LSNs(), l.Commit.CommitLSN())
		}
	}
	if err := ps.AdvanceCommitLSN(files, 10); err == nil {
		t.Fatal("AdvanceCommitLSN accepted on the gated timeline")
	}
}
