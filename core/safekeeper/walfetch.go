package safekeeper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

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
}

// FetchSegment writes WAL segment name (a pg_wal file name) to w: from the
// first safekeeper that holds it, WAL up to the commit LSN (never WAL that
// is not on a quorum), else from the archive. A segment that ends past the
// available WAL is padded with zeros, which Postgres reads as the end of WAL.
func FetchSegment(ctx context.Context, o FetchOptions, name string, w io.Writer) error {
	if o.SegmentSize == 0 {
		o.SegmentSize = pg.WALSegmentSize
	}
	_, no, err := walstore.ParseSegmentName(name, o.SegmentSize)
	if err != nil {
		return err
	}
	segStart := pg.LSN(no * o.SegmentSize)
	segEnd := segStart + pg.LSN(o.SegmentSize)
	var errs []error
	sysID := o.SystemID
	for _, addr := range o.Safekeepers {
		data, id, err := fetchFromSafekeeper(ctx, addr, segStart, segEnd)
		if sysID == 0 {
			sysID = id
		}
		if err == nil {
			_, err = w.Write(append(data, make([]byte, int(o.SegmentSize)-len(data))...))
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if o.Archive != nil {
		if sysID == 0 {
			ids, err := archive.SystemIDs(ctx, o.Archive, o.Prefix)
			if err != nil {
				return err
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

func fetchFromSafekeeper(ctx context.Context, addr string, from, to pg.LSN) ([]byte, uint64, error) {
	c, err := server.Dial(addr)
	if err != nil {
		return nil, 0, err
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return nil, 0, err
	}
	end := min(to, st.CommitLSN)
	if st.StartLSN > from || end <= from {
		return nil, st.SystemID, fmt.Errorf("%w: holds %s..%s (commit %s)", walstore.ErrNotHeld, st.StartLSN, st.FlushLSN, st.CommitLSN)
	}
	data := make([]byte, 0, to-from)
	err = c.ReadWAL(ctx, from, end, server.BoundFlush, func(_ pg.LSN, d []byte) error {
		data = append(data, d...)
		return nil
	})
	return data, st.SystemID, err
}
