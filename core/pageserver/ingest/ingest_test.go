package ingest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

type appendRedo struct{}

func (appendRedo) Apply(k keyspace.Key, lsn pg.LSN, base []byte, recs [][]byte) ([]byte, error) {
	out := append([]byte(nil), base...)
	for _, r := range recs {
		out = append(out, r...)
	}
	return out, nil
}

// fakeWAL serves a fixed list of records from any start LSN, failing once
// in the middle to exercise the reconnect.
type fakeWAL struct {
	mu     sync.Mutex
	recs   []Record
	opens  []pg.LSN
	failed bool
}

type fakeSource struct {
	w   *fakeWAL
	pos int
}

func (w *fakeWAL) open(ctx context.Context, tl pg.TimelineID, start pg.LSN) (Source, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.opens = append(w.opens, start)
	i := 0
	for i < len(w.recs) && w.recs[i].LSN <= start {
		i++
	}
	return &fakeSource{w: w, pos: i}, nil
}

func (s *fakeSource) Next(ctx context.Context) ([]Record, pg.LSN, error) {
	s.w.mu.Lock()
	if s.pos == 3 && !s.w.failed {
		s.w.failed = true
		s.w.mu.Unlock()
		return nil, 0, errors.New("connection reset")
	}
	if s.pos >= len(s.w.recs) {
		s.w.mu.Unlock()
		<-ctx.Done()
		return nil, 0, ctx.Err()
	}
	r := s.w.recs[s.pos]
	s.pos++
	s.w.mu.Unlock()
	return []Record{r}, r.LSN, nil
}

func (s *fakeSource) Close() error { return nil }

type fb struct {
	mu   sync.Mutex
	last timeline.LSNs
}

func (f *fb) Report(_ pg.TimelineID, l timeline.LSNs) { f.mu.Lock(); f.last = l; f.mu.Unlock() }

func TestFollowAppliesDecodedWAL(t *testing.T) {
	commit := &timeline.CommitLSN{}
	tl, err := timeline.Open(context.Background(), pg.TimelineID{1}, t.TempDir(), timeline.Options{NoBackground: true},
		timeline.Deps{Log: zerolog.Nop(), Commit: commit, Redo: appendRedo{}})
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	w := &fakeWAL{recs: []Record{
		{LSN: 100, Rels: []RelChange{{Rel: rel, Nblocks: 0}}},
		{LSN: 200, Blocks: []BlockChange{{Page: rel.Page(0), Kind: layer.WillInit, Data: []byte("init;")}}},
		{LSN: 300, Blocks: []BlockChange{{Page: rel.Page(0), Kind: layer.Delta, Data: []byte("ins1;")}}},
		{LSN: 400, Blocks: []BlockChange{{Page: rel.Page(2), Kind: layer.Image, Data: bytes.Repeat([]byte{7}, 16)}}},
		{LSN: 500, Files: []FileBlock{{Path: "pg_xact/0000", Block: 0, Data: []byte{1, 2, 3}}}},
		{LSN: 600, Blocks: []BlockChange{{Page: rel.Page(0), Kind: layer.Delta, Data: []byte("ins2;")}}},
		{LSN: 700, Rels: []RelChange{{Rel: rel, Drop: true}}},
	}}
	f := &fb{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Follow(ctx, tl, w.open, f, zerolog.Nop()) }()
	deadline := time.Now().Add(10 * time.Second)
	for tl.LSNs().LastRecord < 700 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if tl.LSNs().LastRecord != 700 {
		t.Fatalf("ingested up to %s", tl.LSNs().LastRecord)
	}
	if len(w.opens) != 2 || w.opens[1] == 0 {
		t.Fatalf("reconnect did not resume from the last record: %v", w.opens)
	}
	bg := context.Background()
	if got, err := tl.Get(bg, keyspace.RelBlock(rel.Page(0)), 650); err != nil || string(got) != "init;ins1;ins2;" {
		t.Fatalf("page 0 at 650: %q %v", got, err)
	}
	if got, _ := tl.Get(bg, keyspace.RelBlock(rel.Page(0)), 350); string(got) != "init;ins1;" {
		t.Fatalf("page 0 at 350: %q", got)
	}
	if n, ok, _ := tl.Nblocks(bg, rel, 450); !ok || n != 3 {
		t.Fatalf("size extended by block 2: %d %v", n, ok)
	}
	if _, ok, _ := tl.Nblocks(bg, rel, 700); ok {
		t.Fatal("dropped relation exists")
	}
	if d, err := tl.ReadFile(bg, "pg_xact/0000", 600); err != nil || !bytes.Equal(d, []byte{1, 2, 3}) {
		t.Fatalf("pg_xact: %v %v", d, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last.LastRecord != 700 || f.last.Durable != 700 {
		t.Fatalf("feedback %+v", f.last)
	}
}
