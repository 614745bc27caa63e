package pgstream

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/replication"
	"github.com/stratadb/strata/sdk/replication/replicationtest"
)

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

// startNode runs a lone safekeeper node (its own quorum) whose WAL starts
// at start, until the test ends.
func startNode(t *testing.T, start pg.LSN) *safekeeper.Node {
	t.Helper()
	cfg := safekeeper.DefaultConfig()
	cfg.DataDir, cfg.ListenAddr = t.TempDir(), "127.0.0.1:0"
	n, err := safekeeper.New(cfg, safekeeper.Deps{Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Store().Init(start, 99, 1); err != nil {
		t.Fatal(err)
	}
	if err := n.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return n
}

// TestAcceptance runs the replication acceptance suite against pg-stream
// over a real safekeeper node (its WAL written directly, as a Postgres
// stream would), with a dead safekeeper listed first to exercise failover.
func TestAcceptance(t *testing.T) {
	replicationtest.Run(t, func(t *testing.T) replicationtest.Harness {
		const start = pg.LSN(0x3000000)
		n := startNode(t, start)
		src, err := New(Config{Safekeepers: []string{deadAddr(t), n.Addr()}}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close() })
		return replicationtest.Harness{
			Source: src, Start: start,
			Commit: func(t *testing.T, b []byte) {
				st := n.Store()
				if err := st.Write(st.WriteLSN(), b); err != nil {
					t.Fatal(err)
				}
				end, err := st.Flush()
				if err != nil {
					t.Fatal(err)
				}
				for {
					ch := n.CommitNotify()
					if n.CommitLSN() >= end {
						break
					}
					<-ch
				}
			},
			Progress: func(c string) (replication.Progress, bool) {
				fb, ok := n.ConsumerProgress(c)
				return replication.Progress(fb), ok
			},
		}
	})
}

func TestConfigValidate(t *testing.T) {
	if err := (Config{}).Validate(); err == nil {
		t.Fatal("empty config accepted")
	}
	if _, err := New(Config{Safekeepers: []string{"127.0.0.1:1"}}, zerolog.Nop()); err != nil {
		t.Fatal(fmt.Sprint(err))
	}
}

// TestStreamsFromTheMostAdvanced: of the safekeepers that hold the start,
// a stream opens on the one with the highest commit LSN, not the first
// listed. A safekeeper that missed the end of the WAL while Postgres
// stopped keeps missing it, and a stream on it never reached the end (the
// pageserver's ingest stayed short of the shutdown checkpoint record).
func TestStreamsFromTheMostAdvanced(t *testing.T) {
	const start = pg.LSN(0x3000000)
	node := func(t *testing.T, n int) *safekeeper.Node {
		sk := startNode(t, start)
		st := sk.Store()
		if err := st.Write(start, make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Flush(); err != nil {
			t.Fatal(err)
		}
		for sk.CommitLSN() < start+pg.LSN(n) {
			select {
			case <-sk.CommitNotify():
			case <-time.After(5 * time.Second):
				t.Fatalf("a lone safekeeper's commit LSN %s did not reach its flush %s", sk.CommitLSN(), start+pg.LSN(n))
			}
		}
		return sk
	}
	behind, ahead := node(t, 8000), node(t, 8114)
	src, err := New(Config{Safekeepers: []string{behind.Addr(), ahead.Addr()}}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := src.Stream(ctx, "test", start)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	end := start
	for end < start+8114 {
		ch, err := s.Recv()
		if err != nil {
			t.Fatalf("received up to %s of %s: %v", end, start+8114, err)
		}
		end = ch.Start + pg.LSN(len(ch.Data))
	}
}
