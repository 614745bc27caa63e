package agent

import (
	"context"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/core/safekeeper/server"
)

// joinEvery is how often joinLate looks for safekeepers that missed the
// election.
const joinEvery = 2 * time.Second

// joinLate brings the safekeepers that missed this start's election (down,
// or slower than electGrace) into the term once they answer
// (safekeeper.Join), and adds them to synchronous_standby_names, which
// Postgres reloads. Without it a safekeeper that was down when the compute
// started would not count for synchronous commit until the next start, and
// the cluster would survive no further safekeeper failure even with that
// one back. It returns once every configured safekeeper counts, or when
// ctx ends.
func (a *Agent) joinLate(ctx context.Context) {
	t := time.NewTicker(joinEvery)
	defer t.Stop()
	postgres := "127.0.0.1:" + strconv.Itoa(a.cfg.Port)
	// A safekeeper whose join failed is tried again after a backoff
	// (joinEvery, doubling up to a minute), not on every round.
	type retry struct {
		at    time.Time
		delay time.Duration
	}
	retries := map[string]retry{}
	for {
		a.mu.Lock()
		term, req, ids := a.term, a.accept, slices.Clone(a.syncIDs)
		a.mu.Unlock()
		if len(ids) >= len(a.cfg.Safekeepers) {
			return
		}
		statuses := map[string]server.Status{}
		for _, addr := range a.cfg.Safekeepers {
			if st, err := safekeeperStatus(ctx, addr); err == nil {
				statuses[addr] = st
			}
		}
		inTerm := func(st server.Status) bool {
			return st.Term == term && st.Accepted && st.ComputeID == a.cfg.ComputeID
		}
		// Any member of the term holds the WAL up to its start: prefer the
		// election's donor, else one that answers now.
		if st, ok := statuses[req.Donor]; !ok || !inTerm(st) {
			for addr, st := range statuses {
				if inTerm(st) {
					req.Donor = addr
					break
				}
			}
		}
		added := false
		for _, addr := range a.cfg.Safekeepers {
			st, ok := statuses[addr]
			if !ok || slices.Contains(ids, st.ID) {
				continue
			}
			if st.Term > term {
				continue // a newer compute's; the fence is for Postgres to meet
			}
			if !inTerm(st) {
				if r, ok := retries[addr]; ok && time.Now().Before(r.at) {
					continue
				}
				jctx, cancel := context.WithTimeout(ctx, time.Minute)
				err := safekeeper.Join(jctx, addr, req, postgres)
				cancel()
				if err != nil {
					r := retries[addr]
					r.delay = min(max(2*r.delay, joinEvery), time.Minute)
					r.at = time.Now().Add(r.delay)
					retries[addr] = r
					if ctx.Err() == nil {
						a.log.Warn().Err(err).Str("safekeeper", st.ID).Uint64("term", term).Dur("retry_in", r.delay).Msg("a safekeeper that missed the election could not join the term")
					}
					continue
				}
				delete(retries, addr)
			}
			ids = append(ids, st.ID)
			added = true
			a.log.Info().Str("safekeeper", st.ID).Uint64("term", term).Str("donor", req.Donor).Msg("safekeeper joined the term after the election; it counts for synchronous commit")
		}
		if added {
			if err := a.setSyncStandbys(ctx, ids); err != nil {
				if ctx.Err() == nil {
					a.log.Warn().Err(err).Strs("safekeepers", ids).Msg("updating synchronous_standby_names; will retry")
				}
			} else {
				a.mu.Lock()
				a.syncIDs = ids
				a.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// setSyncStandbys rewrites strata's settings with synchronous_standby_names
// listing ids and has Postgres reload them.
func (a *Agent) setSyncStandbys(ctx context.Context, ids []string) error {
	if err := a.pgs.Configure(a.settings(ids)); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, a.socketConn())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "SELECT pg_reload_conf()")
	return err
}
