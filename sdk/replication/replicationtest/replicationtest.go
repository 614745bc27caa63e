// Package replicationtest is the acceptance suite every replication.Source
// implementation passes.
package replicationtest

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/replication"
)

// Harness is a source under test plus a way to commit WAL to it.
type Harness struct {
	Source replication.Source
	// Commit appends b to the source's WAL and returns once it is committed.
	Commit func(t *testing.T, b []byte)
	// Start is the LSN of the first WAL byte.
	Start pg.LSN
	// Progress, when set, returns the last progress reported by consumer.
	Progress func(consumer string) (replication.Progress, bool)
}

// Run runs the suite; open returns a fresh harness.
func Run(t *testing.T, open func(t *testing.T) Harness) {
	t.Run("StreamCommittedBytes", func(t *testing.T) {
		h := open(t)
		r := rand.New(rand.NewSource(1))
		var want []byte
		for i := 0; i < 5; i++ {
			b := make([]byte, 1+r.Intn(50000))
			r.Read(b)
			h.Commit(t, b)
			want = append(want, b...)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		pos, err := h.Source.Positions(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if pos.Start != h.Start || pos.Commit != h.Start+pg.LSN(len(want)) {
			t.Fatalf("positions %+v, want start %s commit %s", pos, h.Start, h.Start+pg.LSN(len(want)))
		}
		s, err := h.Source.Stream(ctx, "test", h.Start+100)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		got := readUntil(t, s, h.Start+100, h.Start+pg.LSN(len(want)))
		if !bytes.Equal(got, want[100:]) {
			t.Fatal("streamed bytes differ from committed bytes")
		}
		// New WAL arrives on the open stream.
		more := []byte("more committed WAL")
		done := make(chan []byte, 1)
		go func() { done <- readUntil(t, s, h.Start+pg.LSN(len(want)), h.Start+pg.LSN(len(want)+len(more))) }()
		time.Sleep(50 * time.Millisecond)
		h.Commit(t, more)
		select {
		case b := <-done:
			if !bytes.Equal(b, more) {
				t.Fatal("follow-up bytes differ")
			}
		case <-time.After(20 * time.Second):
			t.Fatal("stream did not deliver new WAL")
		}
		if err := s.Feedback(replication.Progress{Received: 5, Durable: 4, Uploaded: 3}); err != nil {
			t.Fatal(err)
		}
		if h.Progress != nil {
			deadline := time.Now().Add(5 * time.Second)
			for {
				p, ok := h.Progress("test")
				if ok && p.Durable == 4 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("feedback not recorded: %+v", p)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	})
	t.Run("StartBeforeHeld", func(t *testing.T) {
		h := open(t)
		h.Commit(t, []byte("x"))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := h.Source.Stream(ctx, "test", h.Start-1)
		if err == nil {
			_, err = s.Recv()
			s.Close()
		}
		if !errors.Is(err, replication.ErrNotHeld) {
			t.Fatalf("stream below the start: %v", err)
		}
	})
	t.Run("CloseUnblocksRecv", func(t *testing.T) {
		h := open(t)
		ctx := context.Background()
		s, err := h.Source.Stream(ctx, "test", h.Start)
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() { _, err := s.Recv(); errc <- err }()
		time.Sleep(50 * time.Millisecond)
		s.Close()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("Recv after Close returned no error")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not unblock Recv")
		}
	})
}

func readUntil(t *testing.T, s replication.Stream, from, to pg.LSN) []byte {
	var out []byte
	pos := from
	for pos < to {
		c, err := s.Recv()
		if err != nil {
			t.Errorf("recv at %s: %v", pos, err)
			return out
		}
		if c.Start != pos {
			t.Errorf("chunk at %s, want %s", c.Start, pos)
			return out
		}
		if c.Start+pg.LSN(len(c.Data)) > c.Commit {
			t.Errorf("chunk passes the commit LSN")
		}
		out = append(out, c.Data...)
		pos += pg.LSN(len(c.Data))
	}
	return out
}
