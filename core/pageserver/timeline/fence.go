package timeline

import (
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// DropPending forgets every pending (gated, not yet durable) version whose
// W is above e and returns how many it dropped. The pageserver calls it
// when a new compute begins a term whose durable end is e: versions a dead
// compute wrote above e depend on WAL that the new term overwrites, and
// must never become durable. Durable versions are never touched.
func (t *Timeline) DropPending(e pg.LSN) int {
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.epoch.Add(1) // before and after, as every write (pageCache.putIf)
	var keep []layer.Version
	dropped := 0
	for _, v := range t.pending {
		if v.LSN <= e {
			keep = append(keep, v)
			continue
		}
		dropped++
		vs := t.pendingKeys[v.Key]
		for i := range vs {
			if vs[i].Seq == v.Seq {
				vs = append(vs[:i], vs[i+1:]...)
				break
			}
		}
		if len(vs) == 0 {
			delete(t.pendingKeys, v.Key)
		} else {
			t.pendingKeys[v.Key] = vs
		}
		t.cache.invalidate(v.Key)
	}
	if dropped > 0 {
		t.pending = keep
		t.pendingMin = minLSN(keep)
		t.epoch.Add(1)
	}
	return dropped
}

// PendingCount returns the number of pending (gated) versions; cheaper than
// LSNs, and it does not read the commit LSN source.
func (t *Timeline) PendingCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.pending)
}
