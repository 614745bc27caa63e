package safekeeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/stratadb/strata/core/safekeeper/archive"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// ErrSegmentNotFound: no safekeeper and no archive holds the segment.
var ErrSegmentNotFound = errors.New("safekeeper: WAL segment not found")

// FetchOptions say where `strata wal fetch` looks for WAL.
type FetchOptions struct {
	// Safekeepers are gRPC addresses, tried in order.
	Safekeepers []string
	// Archive and Prefix locate archived WAL (Archive may be nil).
	Archive objectstore.Store
	Prefix  string
	// SystemID selects the cluster in the archive; 0 takes it from a
	// safekeeper, or the only one in the archive.
	SystemID uint64
	// SegmentSize defaults to 16 MiB.
	SegmentSize uint64
	// TailWait bounds the wait for the last, partial segment's WAL to be
	// known committed (default DefaultTailWait; see FetchSegment).
	TailWait time.Duration
}

// DefaultTailWait is FetchOptions.TailWait's default.
const DefaultTailWait = 3 * time.Second

// ErrAmbiguousArchive: the archive holds the WAL of more than one cluster
// and FetchOptions does not say which (SystemID, or a safekeeper that
// answers).
var ErrAmbiguousArchive = errors.New("more than one cluster's WAL")

// FetchSegment writes WAL segment name (a pg_wal file name) to w: from the
// first safekeeper that holds it, WAL up to the commit LSN (never WAL that
// is not on a quorum), else from the archive. A segment that ends past the
// available WAL is padded with zeros, which Postgres reads as the end of WAL.
//
// A safekeeper learns the commit LSN from its peers, once a second while
// nobody waits for it (writeback mode), so its own figure can trail WAL
// that a quorum already holds. For a segment that reaches past it, the
// fetch asks for committed WAL up to the highest flush LSN of the listed
// safekeepers, which makes the safekeeper poll its peers at once; it takes
// what is committed when that WAL arrives or TailWait ends (WAL beyond a
// quorum never arrives: the safekeepers that have it were not acknowledged).
func FetchSegment(ctx context.Context, o FetchOptions, name string, w io.Writer) error {
	if o.SegmentSize == 0 {
		o.SegmentSize = pg.WALSegmentSize
	}
	if o.TailWait <= 0 {
		o.TailWait = DefaultTailWait
	}
	_, no, err := walstore.ParseSegmentName(name, o.SegmentSize)
	if err != nil {
		return err
	}
	segStart := pg.LSN(no * o.SegmentSize)
	segEnd := segStart + pg.LSN(o.SegmentSize)
	var errs []error
	sysID := o.SystemID
	probes := probeAll(ctx, o.Safekeepers)
	defer func() {
		for _, p := range probes {
			p.close()
		}
	}()
	var maxFlush pg.LSN
	for _, p := range probes {
		if p.err == nil {
			maxFlush = max(maxFlush, p.st.FlushLSN)
		}
	}
	for _, p := range probes {
		var data []byte
		err := p.err
		if err == nil {
			if sysID == 0 {
				sysID = p.st.SystemID
			}
			data, err = fetchFromSafekeeper(ctx, p, segStart, segEnd, maxFlush, o.TailWait)
		}
		if err == nil {
			_, err = w.Write(append(data, make([]byte, int(o.SegmentSize)-len(data))...))
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", p.addr, err))
	}
	if o.Archive != nil {
		if sysID == 0 {
			ids, err := archive.SystemIDs(ctx, o.Archive, o.Prefix)
			if err != nil {
				return err
			}
			if len(ids) > 1 {
				// The store holds the WAL of several clusters (one bucket
				// for many, or a cluster made again over an old one's
				// objects): a guess could be another cluster's WAL.
				errs = append(errs, fmt.Errorf("archive: %w under %q: the WAL of %d clusters (system identifiers %v), and no safekeeper answered to say which is this one's (strata wal fetch --system-id)", ErrAmbiguousArchive, o.Prefix, len(ids), ids))
				return fmt.Errorf("%w: %s: %w", ErrSegmentNotFound, name, errors.Join(errs...))
			}
			if len(ids) == 1 {
				sysID = ids[0]
			}
		}
		var buf bytes.Buffer
		err := archive.Fetch(ctx, o.Archive, o.Prefix, sysID, name, int64(o.SegmentSize), &buf)
		if err == nil {
			_, err = w.Write(buf.Bytes())
			return err
		}
		errs = append(errs, fmt.Errorf("archive: %w", err))
	}
	return fmt.Errorf("%w: %s: %w", ErrSegmentNotFound, name, errors.Join(errs...))
}

// probe is one safekeeper of a fetch: its connection and the status it
// reported when the fetch began (err when it could not be reached).
type probe struct {
	addr string
	c    *server.Client
	st   server.Status
	err  error
}

func (p *probe) close() {
	if p.c != nil {
		p.c.Close()
	}
}

// probeTimeout bounds the wait for a safekeeper's status in a fetch: one
// that does not answer within it (a hung host) is skipped.
var probeTimeout = 5 * time.Second

// probeAll dials the safekeepers at addrs and asks each for its status, all
// at once; the connections stay open for the reads that follow.
func probeAll(ctx context.Context, addrs []string) []*probe {
	sctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	probes := make([]*probe, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		p := &probe{addr: a}
		probes[i] = p
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p.c, p.err = server.Dial(a); p.err != nil {
				return
			}
			p.st, p.err = p.c.Status(sctx)
		}()
	}
	wg.Wait()
	return probes
}

// fetchFromSafekeeper reads committed WAL in [from, to) from the safekeeper
// of p: up to its commit LSN at once, and past it, up to flush (the group's
// highest flush LSN) as the commit LSN reaches it, for at most wait.
func fetchFromSafekeeper(ctx context.Context, p *probe, from, to, flush pg.LSN, wait time.Duration) ([]byte, error) {
	c, st := p.c, p.st
	if st.StartLSN > from || from >= to {
		return nil, fmt.Errorf("%w: holds %s..%s (commit %s)", walstore.ErrNotHeld, st.StartLSN, st.FlushLSN, st.CommitLSN)
	}
	data := make([]byte, 0, to-from)
	keep := func(_ pg.LSN, d []byte) error {
		data = append(data, d...)
		return nil
	}
	if end := min(to, st.CommitLSN); end > from {
		if err := c.ReadWAL(ctx, from, end, server.BoundFlush, keep); err != nil {
			return nil, err
		}
	}
	if tail := min(to, max(flush, st.FlushLSN)); tail > from+pg.LSN(len(data)) {
		tctx, cancel := context.WithTimeout(ctx, wait)
		err := c.ReadWAL(tctx, from+pg.LSN(len(data)), tail, server.BoundCommit, keep)
		expired := tctx.Err() != nil
		cancel()
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case expired:
			// What arrived within the wait is committed WAL; the rest is
			// not known committed (yet): the next call may get more.
		default:
			// A failed read here would end the segment early, and Postgres
			// would take that for the end of WAL: let another safekeeper
			// serve it.
			return nil, fmt.Errorf("reading WAL past the commit LSN %s: %w", st.CommitLSN, err)
		}
	}
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: holds %s..%s (commit %s)", walstore.ErrNotHeld, st.StartLSN, st.FlushLSN, st.CommitLSN)
	}
	return data, nil
}
