package safekeeper

import (
	"maps"
	"time"

	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/sdk/pg"
)

// consumerSet is what a safekeeper knows of its WAL consumers (pageservers
// that ingest WAL): the progress each reported, to this node or to a peer,
// and which ones it forgot. A consumer that stays behind the commit LSN
// without making progress for the expiry time (a pageserver whose
// timeline was abandoned, or that went away for good) is forgotten, so
// that it no longer holds the group's local WAL; should it come back, the
// WAL it needs that is gone from the disks is streamed from the archive.
// Not safe for concurrent use: the Node's mutex guards it.
type consumerSet struct {
	progress map[string]server.Feedback
	// live is when each consumer last advanced or was seen caught up.
	live map[string]time.Time
	// forgot is the durable LSN each forgotten consumer had: a peer that
	// still reports it at or below that is repeating old news.
	forgot map[string]pg.LSN
}

func newConsumerSet() *consumerSet {
	return &consumerSet{progress: map[string]server.Feedback{}, live: map[string]time.Time{}, forgot: map[string]pg.LSN{}}
}

// note merges progress reported by the consumer itself or by a peer. A
// forgotten consumer returns once it reports progress beyond where it was
// forgotten (before that, a peer's report of it is old news, and its own
// is no progress).
func (s *consumerSet) note(id string, fb server.Feedback, now time.Time) {
	if gone, ok := s.forgot[id]; ok {
		if fb.Durable <= gone {
			return
		}
		delete(s.forgot, id)
	}
	old, known := s.progress[id]
	merged := old.Max(fb)
	if !known || merged.Durable > old.Durable {
		s.live[id] = now
	}
	s.progress[id] = merged
}

// expire forgets the consumers that are behind committed and made no
// progress for longer than after (0: never), and returns what they had.
func (s *consumerSet) expire(now time.Time, committed pg.LSN, after time.Duration) map[string]server.Feedback {
	if after <= 0 {
		return nil
	}
	var gone map[string]server.Feedback
	for id, fb := range s.progress {
		if fb.Durable >= committed {
			s.live[id] = now
			continue
		}
		if now.Sub(s.live[id]) <= after {
			continue
		}
		if gone == nil {
			gone = map[string]server.Feedback{}
		}
		gone[id] = fb
		s.forgot[id] = fb.Durable
		delete(s.progress, id)
		delete(s.live, id)
	}
	return gone
}

// lowestDurable is the lowest LSN that every known consumer made durable;
// ok is false when there is no consumer.
func (s *consumerSet) lowestDurable() (low pg.LSN, ok bool) {
	for _, fb := range s.progress {
		if !ok || fb.Durable < low {
			low, ok = fb.Durable, true
		}
	}
	return low, ok
}

func (s *consumerSet) get(id string) (server.Feedback, bool) {
	fb, ok := s.progress[id]
	return fb, ok
}

func (s *consumerSet) snapshot() map[string]server.Feedback { return maps.Clone(s.progress) }
