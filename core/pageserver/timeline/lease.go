package timeline

import (
	"fmt"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// MaxLeaseTTL bounds one lease: a reader that stops renewing (killed, cut
// off) holds GC back at most this long.
const MaxLeaseTTL = time.Hour

// leaseKey names a lease: a holder's lease of an LSN.
type leaseKey struct {
	lsn    pg.LSN
	holder string
}

// Lease keeps the history that reads at lsn need until the lease ends: GC
// does not raise the cutoff above a leased LSN while its lease runs.
// holder names who holds it (a restore, a branch being made): a lease is
// renewed, and ended, only by its holder, so two restores at one LSN do
// not end each other's. A renewal runs until the later of the two ends;
// ttl 0 ends the holder's lease now. Leasing an LSN below the cutoff
// fails with ErrBelowGCCutoff (that history may be gone). Leases live in
// memory: a restarted pageserver has none, so GC keeps the cutoff for
// Options.LeaseGrace after a restart, and a reader renews its lease well
// within that (a restore renews every 15 s).
//
// It returns when the lease ends (zero when it was ended).
func (t *Timeline) Lease(lsn pg.LSN, holder string, ttl time.Duration) (time.Time, error) {
	if ttl < 0 || ttl > MaxLeaseTTL {
		return time.Time{}, fmt.Errorf("timeline: lease of %s for %s: the lease length must be between 0 and %s", lsn, ttl, MaxLeaseTTL)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.d.Now()
	t.dropEndedLeasesLocked(now)
	k := leaseKey{lsn, holder}
	if ttl == 0 {
		delete(t.leases, k)
		return time.Time{}, nil
	}
	if lsn < t.gcCutoff {
		return time.Time{}, fmt.Errorf("%w: lease at %s, cutoff %s", ErrBelowGCCutoff, lsn, t.gcCutoff)
	}
	end := now.Add(ttl)
	if t.leases == nil {
		t.leases = map[leaseKey]time.Time{}
	}
	if e, ok := t.leases[k]; !ok || e.Before(end) {
		t.leases[k] = end
	}
	return t.leases[k], nil
}

// oldestLeaseLocked returns the lowest LSN a lease running at now holds,
// or 0. It is called under mu (either way).
func (t *Timeline) oldestLeaseLocked(now time.Time) pg.LSN {
	var o pg.LSN
	for k, end := range t.leases {
		if end.After(now) && (o == 0 || k.lsn < o) {
			o = k.lsn
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
	for k, end := range t.leases {
		if !end.After(now) {
			delete(t.leases, k)
		}
	}
}
