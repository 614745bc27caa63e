package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// pageserverOutage is how long a restore keeps asking a pageserver that
// does not answer (one its supervisor restarts after a crash takes a few
// seconds; in redo mode its WAL ingest must also reach X again) before it
// gives up. The lease on X outlives such a restart: a restarted pageserver
// keeps its GC cutoff until readers have renewed their leases
// (timeline.Options.LeaseGrace).
const pageserverOutage = 2 * time.Minute

// outages says once per outage that the restore waits for the pageserver,
// and when it answers again: the workers that read pages at once share
// it.
type outages struct {
	mu      sync.Mutex
	since   time.Time // zero: none now
	limit   time.Duration
	say     func(string)
	stopped func() error // nil, or Options.Stopped
}

// outage reports whether err says the pageserver is not there for now
// (the connection refused or cut, the stream ended) or has not caught up
// with X yet (redo mode's WAL ingest after a restart), rather than that
// the read itself failed.
func outage(err error) bool {
	return status.Code(err) == codes.Unavailable || errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, timeline.ErrWaitLSNTimeout)
}

// ask runs call until it succeeds, fails otherwise than by an outage, or
// the outage has lasted the limit. A nil u asks once.
func (u *outages) ask(ctx context.Context, call func() error) error {
	if u == nil {
		return call()
	}
	wait := 250 * time.Millisecond
	for {
		err := call()
		if err == nil || !outage(err) || ctx.Err() != nil {
			if err == nil {
				u.mu.Lock()
				if !u.since.IsZero() {
					u.say(fmt.Sprintf("the pageserver answers again after %s", time.Since(u.since).Round(100*time.Millisecond)))
					u.since = time.Time{}
				}
				u.mu.Unlock()
			}
			return err
		}
		if u.stopped != nil {
			if why := u.stopped(); why != nil {
				return fmt.Errorf("%w (%v)", err, why)
			}
		}
		u.mu.Lock()
		if u.since.IsZero() {
			u.since = time.Now()
			u.say(fmt.Sprintf("the pageserver does not answer (%v): asking again for up to %s", err, u.limit))
		}
		long := time.Since(u.since)
		u.mu.Unlock()
		if long > u.limit {
			return fmt.Errorf("%w (the pageserver did not answer for %s)", err, long.Round(time.Second))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// control reads pg_control of the files timeline at lsn (at PagesEnd
// when lsn is past it), asking again through a pageserver outage.
func (o Options) control(ctx context.Context, lsn pg.LSN) (ctl []byte, err error) {
	if o.PagesEnd > 0 {
		lsn = min(lsn, o.PagesEnd)
	}
	err = o.down.ask(ctx, func() (err error) {
		ctl, err = o.Pageserver.GetFile(ctx, o.FilesTimeline, ControlFile, lsn)
		return err
	})
	return ctl, err
}
