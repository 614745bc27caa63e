package timeline

import (
	"fmt"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// MaxLeaseTTL bounds one lease: a reader that stops renewing (killed, cut
// off) holds GC back at most this long.
const MaxLeaseTTL = time.Hour

// Lease keeps the history that reads at lsn need until the lease ends: GC
// does not raise the cutoff above a leased LSN while its lease runs. A
// lease of an LSN already leased runs until the later of the two ends;
// ttl 0 ends it now. Leasing an LSN below the cutoff fails with
// ErrBelowGCCutoff (that history may be gone). Leases live in memory:
// a restarted pageserver has none, and a reader renews its lease well
// before it ends (a restore renews every few seconds).
//
// It returns when the lease ends (zero when it was ended).
func (t *Timeline) Lease(lsn pg.LSN, ttl time.Duration) (time.Time, error) {
	if ttl < 0 || ttl > MaxLeaseTTL {
		return time.Time{}, fmt.Errorf("timeline: lease of %s for %s: the lease length must be between 0 and %s", lsn, ttl, MaxLeaseTTL)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.d.Now()
	t.dropEndedLeasesLocked(now)
	if ttl == 0 {
		delete(t.leases, lsn)
		return time.Time{}, nil
	}
	if lsn < t.gcCutoff {
		return time.Time{}, fmt.Errorf("%w: lease at %s, cutoff %s", ErrBelowGCCutoff, lsn, t.gcCutoff)
	}
	end := now.Add(ttl)
	if t.leases == nil {
		t.leases = map[pg.LSN]time.Time{}
	}
	if e, ok := t.leases[lsn]; !ok || e.Before(end) {
		t.leases[lsn] = end
	}
	return t.leases[lsn], nil
}

// oldestLeaseLocked returns the lowest LSN a lease running at now holds,
// or 0. It is called under mu (either way).
func (t *Timeline) oldestLeaseLocked(now time.Time) pg.LSN {
	var o pg.LSN
	for lsn, end := range t.leases {
		if end.After(now) && (o == 0 || lsn < o) {
			o = lsn
		}
	}
	return o
}

// runningLeasesLocked counts the leases running at now (under mu).
func (t *Timeline) runningLeasesLocked(now time.Time) int {
	n := 0
	for _, end := range t.leases {
		if end.After(now) {
			n++
		}
	}
	return n
}

func (t *Timeline) dropEndedLeasesLocked(now time.Time) {
	for lsn, end := range t.leases {
		if !end.After(now) {
			delete(t.leases, lsn)
		}
	}
}
