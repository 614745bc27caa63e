package pgstream

import (
	"context"
	"fmt"
	"net"
	"testing"

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

// TestAcceptance runs the replication acceptance suite against pg-stream
// over a real safekeeper node (its WAL written directly, as a Postgres
// stream would), with a dead safekeeper listed first to exercise failover.
func TestAcceptance(t *testing.T) {
	replicationtest.Run(t, func(t *testing.T) replicationtest.Harness {
		cfg := safekeeper.DefaultConfig()
		cfg.DataDir, cfg.ListenAddr = t.TempDir(), "127.0.0.1:0"
		n, err := safekeeper.New(cfg, safekeeper.Deps{Logger: zerolog.Nop()})
		if err != nil {
			t.Fatal(err)
		}
		const start = pg.LSN(0x3000000)
		if err := n.Store().Init(start, 99, 1); err != nil {
			t.Fatal(err)
		}
		if err := n.Listen(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { n.Run(ctx); close(done) }()
		src, err := New(Config{Safekeepers: []string{deadAddr(t), n.Addr()}}, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { src.Close(); cancel(); <-done })
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
