package safekeeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// TestFetchFromPeerThatWasDown: a peer that did not answer while this node
// polled it (all safekeepers starting together) leaves the connection
// failing fast during gRPC's reconnect backoff; a catch-up from it right
// after it comes up still succeeds, and copies its bytes.
func TestFetchFromPeerThatWasDown(t *testing.T) {
	addrA := fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t))
	addrB := fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t))
	// The folders first: their removal must come after the nodes stop
	// (cleanups run last registered first).
	dirs := map[string]string{"sk1": t.TempDir(), "sk2": t.TempDir()}
	newNode := func(id, addr, peer string) *Node {
		cfg := DefaultConfig()
		cfg.ID, cfg.DataDir, cfg.ListenAddr, cfg.Peers = id, dirs[id], addr, []string{peer}
		cfg.Postgres = "postgres://nobody@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1"
		n, err := New(cfg, Deps{Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	run := func(n *Node) {
		wg.Add(1)
		go func() { defer wg.Done(); n.Run(ctx) }()
	}
	a := newNode("sk1", addrA, addrB)
	run(a) // its peer loop polls B, which is down: the connection backs off
	const start = pg.LSN(16 << 20)
	data := bytes.Repeat([]byte("strata wal "), 3000)
	b := newNode("sk2", addrB, addrA)
	for _, st := range []*Node{a, b} {
		if err := st.Store().Init(start, 42, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Store().Write(start, data); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Store().Flush(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if err := b.Listen(); err != nil {
		t.Fatal(err)
	}
	run(b)
	fctx, fcancel := context.WithTimeout(ctx, time.Minute)
	defer fcancel()
	end := start + pg.LSN(len(data))
	if err := a.fetchFrom(fctx, addrB, start, end); err != nil {
		t.Fatalf("catch-up from a peer that just came up: %v", err)
	}
	if got := a.Store().FlushLSN(); got != end {
		t.Fatalf("flush after the catch-up %s, want %s", got, end)
	}
	var copied []byte
	for pos := start; pos < end; {
		d, err := a.Store().Read(pos, int(end-pos))
		if err != nil || len(d) == 0 {
			t.Fatalf("reading the copy at %s: %v", pos, err)
		}
		copied = append(copied, d...)
		pos += pg.LSN(len(d))
	}
	if !bytes.Equal(copied, data) {
		t.Fatalf("copied %d bytes that differ from the peer's %d", len(copied), len(data))
	}
}

// TestFetchTailNeverCommitted: WAL that a safekeeper holds but no quorum
// does (its only peer is down) is never served; the fetch waits TailWait
// for it and then reports the segment missing.
func TestFetchTailNeverCommitted(t *testing.T) {
	addr := fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t))
	down := fmt.Sprintf("127.0.0.1:%d", pgtest.FreePort(t))
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.ID, cfg.DataDir, cfg.ListenAddr, cfg.Peers = "sk1", dir, addr, []string{down}
	cfg.Postgres = "postgres://nobody@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1"
	n, err := New(cfg, Deps{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	const start = pg.LSN(16 << 20)
	if err := n.Store().Init(start, 42, 1); err != nil {
		t.Fatal(err)
	}
	if err := n.Store().Write(start, bytes.Repeat([]byte("uncommitted "), 1000)); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Store().Flush(); err != nil {
		t.Fatal(err)
	}
	if err := n.Listen(); err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); n.Run(ctx) }()
	if c := n.CommitLSN(); c > start {
		t.Fatalf("commit LSN %s past the start with the only peer down", c)
	}
	const wait = 400 * time.Millisecond
	t0 := time.Now()
	var buf bytes.Buffer
	err = FetchSegment(ctx, FetchOptions{Safekeepers: []string{addr}, TailWait: wait}, "000000010000000000000001", &buf)
	took := time.Since(t0)
	if !errors.Is(err, ErrSegmentNotFound) || buf.Len() != 0 {
		t.Fatalf("fetch of WAL no quorum holds: %d bytes, %v; want none and ErrSegmentNotFound", buf.Len(), err)
	}
	if took < wait || took > wait+5*time.Second {
		t.Fatalf("the fetch took %s, want its tail wait %s and little more", took, wait)
	}
	t.Logf("refused after %s: %v", took.Round(time.Millisecond), err)
}
