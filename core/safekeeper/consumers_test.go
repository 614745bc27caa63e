package safekeeper

import (
	"testing"
	"time"

	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/sdk/pg"
)

func fbAt(l pg.LSN) server.Feedback { return server.Feedback{Received: l, Durable: l} }

// TestConsumerSetExpiry: a consumer that stays behind the commit LSN
// without progress for the expiry time is forgotten (it no longer holds
// the lowest durable LSN down); one that advances or is caught up is not,
// however long the group is idle; a peer's stale report does not bring a
// forgotten consumer back, progress does.
func TestConsumerSetExpiry(t *testing.T) {
	const hour = time.Hour
	t0 := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	s := newConsumerSet()
	s.note("pageserver-old", fbAt(100), t0)
	s.note("pageserver-new", fbAt(500), t0)
	if low, ok := s.lowestDurable(); !ok || low != 100 {
		t.Fatalf("lowest durable %s %v, want 0/64", low, ok)
	}
	// The new one advances every half hour; the old one never does.
	for i := 1; i <= 2; i++ {
		now := t0.Add(time.Duration(i) * 30 * time.Minute)
		s.note("pageserver-new", fbAt(pg.LSN(500+i)), now)
		s.note("pageserver-old", fbAt(100), now) // a peer repeating it
		if gone := s.expire(now, 1000, hour); len(gone) != 0 {
			t.Fatalf("after %d min: forgot %v, want nobody (within the expiry)", i*30, gone)
		}
	}
	now := t0.Add(hour + time.Minute)
	s.note("pageserver-new", fbAt(503), now)
	gone := s.expire(now, 1000, hour)
	if len(gone) != 1 || gone["pageserver-old"].Durable != 100 {
		t.Fatalf("forgot %v, want pageserver-old at 0/64", gone)
	}
	if low, _ := s.lowestDurable(); low != 503 {
		t.Fatalf("lowest durable after the expiry %s, want 0/1F7", low)
	}
	if _, ok := s.get("pageserver-old"); ok {
		t.Fatal("the forgotten consumer is still listed")
	}
	if _, ok := s.snapshot()["pageserver-old"]; ok {
		t.Fatal("the forgotten consumer is still in the status")
	}
	// A peer that has not forgotten it yet repeats its old progress: old news.
	s.note("pageserver-old", fbAt(100), now)
	if _, ok := s.get("pageserver-old"); ok {
		t.Fatal("a peer's stale report brought the forgotten consumer back")
	}
	// It returns once it reports progress beyond where it was forgotten.
	s.note("pageserver-old", fbAt(101), now)
	if fb, ok := s.get("pageserver-old"); !ok || fb.Durable != 101 {
		t.Fatalf("a forgotten consumer that made progress: %+v %v, want back at 0/65", fb, ok)
	}

	// An idle group: nothing new is committed, the consumer is caught up,
	// and it stays for days; when WAL comes again it is not forgotten at
	// once.
	s = newConsumerSet()
	s.note("pageserver-x", fbAt(1000), t0)
	for d := 1; d <= 3; d++ {
		if gone := s.expire(t0.Add(time.Duration(d)*24*hour), 1000, hour); len(gone) != 0 {
			t.Fatalf("idle day %d: forgot %v", d, gone)
		}
	}
	if gone := s.expire(t0.Add(72*hour+time.Second), 2000, hour); len(gone) != 0 {
		t.Fatalf("first second of new WAL after an idle spell: forgot %v", gone)
	}
	// 0 never expires.
	if gone := s.expire(t0.Add(1000*hour), 5000, 0); len(gone) != 0 {
		t.Fatalf("expiry 0 forgot %v", gone)
	}
}
