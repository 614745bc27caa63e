package restore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// The lease a restore holds on the history it reads: long enough that a
// short stall (a busy pageserver, a paused process) does not lose it,
// short enough that a restore killed with -9 holds GC back only briefly.
// It is renewed four times per length.
const (
	leaseTTL   = time.Minute
	leaseRenew = leaseTTL / 4
)

// lease keeps the pageserver's GC from passing the LSN a restore reads
// at, on each timeline the restore reads, until release. The pageserver
// holds leases in memory only: after a pageserver restart it keeps its
// GC cutoff for timeline.Options.LeaseGrace (a minute, four renewals), and
// the next renewal takes the lease again.
type lease struct {
	o      Options
	holder string // this restore's name for its leases
	tls    []pg.TimelineID
	mu     sync.Mutex
	at     pg.LSN // 0 when the pageserver has no leases (an older one)
	stop   chan struct{}
	done   chan struct{}
}

// holdHistory leases the history at lsn. The error wraps ErrTooOld when
// lsn is already below the GC cutoff.
func holdHistory(ctx context.Context, o Options, lsn pg.LSN) (*lease, error) {
	l := &lease{o: o, tls: []pg.TimelineID{o.Timeline}, stop: make(chan struct{}), done: make(chan struct{}),
		holder: fmt.Sprintf("restore pid %d %x", os.Getpid(), rand.Uint32())}
	if o.FilesTimeline != o.Timeline {
		l.tls = append(l.tls, o.FilesTimeline)
	}
	ok, err := l.take(ctx, lsn)
	if err != nil {
		return nil, err
	}
	if !ok {
		o.Log.Warn().Msg("the pageserver takes no leases (an older version): its GC may pass the restore's LSN while it reads")
		close(l.done)
		return l, nil
	}
	l.at = lsn
	go l.renew()
	return l, nil
}

// take leases lsn on every timeline. It reports false when the pageserver
// does not know the call.
func (l *lease) take(ctx context.Context, lsn pg.LSN) (bool, error) {
	for _, tl := range l.tls {
		_, err := l.o.Pageserver.LeaseLSN(ctx, tl, lsn, l.holder, leaseTTL)
		switch {
		case err == nil:
		case status.Code(err) == codes.Unimplemented:
			return false, nil
		case errors.Is(err, timeline.ErrBelowGCCutoff):
			return false, fmt.Errorf("%w: the pageserver's GC passed %s before the restore could hold it: %v", ErrTooOld, lsn, err)
		default:
			return false, fmt.Errorf("restore: holding the page history at %s: %w", lsn, err)
		}
	}
	return true, nil
}

// move leases lsn (at or above the held LSN) and ends the lease on the
// one held before.
func (l *lease) move(ctx context.Context, lsn pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.at == 0 || l.at == lsn {
		return nil
	}
	if _, err := l.take(ctx, lsn); err != nil {
		return err
	}
	old := l.at
	l.at = lsn
	l.end(ctx, old)
	return nil
}

func (l *lease) end(ctx context.Context, lsn pg.LSN) {
	for _, tl := range l.tls {
		if _, err := l.o.Pageserver.LeaseLSN(ctx, tl, lsn, l.holder, 0); err != nil {
			l.o.Log.Warn().Err(err).Stringer("lsn", lsn).Msg("ending a lease (it runs out by itself)")
		}
	}
}

func (l *lease) renew() {
	defer close(l.done)
	t := time.NewTicker(leaseRenew)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		ctx, cancel := context.WithTimeout(context.Background(), leaseRenew)
		if _, err := l.take(ctx, l.at); err != nil {
			l.o.Log.Warn().Err(err).Msg("renewing the restore's lease on the page history")
		}
		cancel()
		l.mu.Unlock()
	}
}

// release stops renewing and ends the lease.
func (l *lease) release() {
	select {
	case <-l.done:
		return
	default:
	}
	close(l.stop)
	<-l.done
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.end(ctx, l.at)
}
