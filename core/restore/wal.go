package restore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// segments is a wal.Source that fetches each segment when the reader
// first asks for one of its pages (from the safekeepers, then the
// archive), holding the WAL below end only. With dir set it also writes
// every segment it fetched there, owned by uid:gid, as pg_wal needs it.
type segments struct {
	ctx      context.Context
	src      agent.WALSource
	tli      pg.PGTimeline
	end      pg.LSN
	dir      string
	uid, gid int

	no      uint64
	data    []byte
	fetched int
	onFetch func(no uint64)
}

func (s *segments) SegmentSize() uint64 { return s.src.SegmentSize }

func (s *segments) ReadPage(lsn pg.LSN, buf []byte) error {
	if lsn >= s.end {
		return fmt.Errorf("%w: at %s, the durable end", wal.ErrEndOfWAL, s.end)
	}
	seg := s.src.SegmentSize
	no := uint64(lsn) / seg
	if s.data == nil || s.no != no {
		data, err := agent.FetchSegment(s.ctx, s.src, s.tli, no, s.end)
		if err != nil {
			return err
		}
		if s.dir != "" {
			if err := s.write(no, data); err != nil {
				return err
			}
		}
		s.no, s.data = no, data
		s.fetched++
		if s.onFetch != nil {
			s.onFetch(no)
		}
	}
	off := uint64(lsn) - no*seg
	copy(buf, s.data[off:off+wal.PageSize])
	return nil
}

func (s *segments) write(no uint64, data []byte) error {
	p := filepath.Join(s.dir, walpos.FormatSegmentName(s.tli, no, s.src.SegmentSize))
	tmp := p + ".strata-tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if err := os.Lchown(tmp, s.uid, s.gid); err != nil && os.Getuid() == 0 {
		return err
	}
	return os.Rename(tmp, p)
}

// walResult is what fetchWAL found.
type walResult struct {
	consistent pg.LSN // the end of the last record that starts before x
	next       bool   // a whole record that starts at or after x was read
	segments   int
}

// fetchWAL writes into dir the WAL segments from the one holding from (a
// checkpoint's REDO point) to the one where the first record at or after
// x ends, reading every record on the way (CRC, back links): recovery
// must be able to replay all of them. When the WAL read from the first
// safekeeper breaks off before x, the others are tried first in turn, as
// FillWAL does.
func fetchWAL(ctx context.Context, src agent.WALSource, dir string, tli pg.PGTimeline, from, x, end pg.LSN, uid, gid int, progress func(string)) (walResult, error) {
	var errs []error
	for i := range max(1, len(src.Safekeepers)) {
		// Each try starts from an empty pg_wal: nothing of a source whose
		// WAL broke off stays behind.
		if err := os.RemoveAll(dir); err != nil {
			return walResult{}, err
		}
		if err := os.MkdirAll(filepath.Join(dir, "archive_status"), 0o700); err != nil {
			return walResult{}, err
		}
		try := src
		try.Safekeepers = append(append([]string(nil), src.Safekeepers[i:]...), src.Safekeepers[:i]...)
		s := &segments{ctx: ctx, src: try, tli: tli, end: end, dir: dir, uid: uid, gid: gid}
		total := int(uint64(x)/src.SegmentSize-uint64(from)/src.SegmentSize) + 1
		tick := time.Now()
		s.onFetch = func(no uint64) {
			if time.Since(tick) >= time.Second {
				tick = time.Now()
				progress(fmt.Sprintf("WAL: segment %d of about %d", s.fetched, total))
			}
		}
		res, err := walkTo(ctx, s, from, x)
		if err == nil {
			res.segments = s.fetched
			return res, nil
		}
		if ctx.Err() != nil {
			return walResult{}, ctx.Err()
		}
		first := "the archive"
		if len(try.Safekeepers) > 0 {
			first = try.Safekeepers[0]
		}
		errs = append(errs, fmt.Errorf("WAL preferring %s: %w", first, err))
	}
	return walResult{}, fmt.Errorf("restore: the WAL from %s to %s cannot be read: %w", from, x, errors.Join(errs...))
}

// walkTo reads the records from `from` until one starts at or after x.
// When the WAL ends first, it must end where the durable WAL's last
// complete record does (no record follows x yet); ending earlier is a
// hole or a damaged record, which recovery would stop at.
func walkTo(ctx context.Context, s *segments, from, x pg.LSN) (walResult, error) {
	rd := wal.NewReader(s, from)
	var res walResult
	for {
		r, err := rd.Next()
		if err != nil {
			// The durable end may cut the last record: reading stops
			// there, at the end of the last whole record, or it stops
			// early at a hole or a damaged record. Records that reach
			// the durable end (an XLOG_SWITCH's, which takes the rest
			// of its segment, ending it there) leave nothing out.
			reached := pg.LSN((uint64(max(res.consistent, from)) + 7) &^ 7)
			if reached >= s.end {
				return res, nil
			}
			read := func(_ context.Context, a, b pg.LSN) ([]byte, error) {
				buf := make([]byte, wal.PageSize)
				page := a / wal.PageSize * wal.PageSize
				if err := s.ReadPage(page, buf); err != nil {
					return nil, err
				}
				return buf[a-page : b-page], nil
			}
			want, werr := walpos.RecordEndAtOrBelow(ctx, read, s.end, from, s.src.SegmentSize)
			if werr != nil {
				return walResult{}, fmt.Errorf("the records end at %s (%w), and the last record before the durable end %s was not found: %w", max(res.consistent, from), err, s.end, werr)
			}
			if reached >= want {
				return res, nil
			}
			return walResult{}, fmt.Errorf("the records end at %s, the last record before the durable end %s ends at %s: %w", max(res.consistent, from), s.end, want, err)
		}
		if r.LSN >= x {
			res.next = true
			return res, nil
		}
		res.consistent = r.EndLSN
	}
}

// lsnForTime returns the WAL position of o.At.Time: the start of the first
// commit or abort record stamped after it, where Postgres'
// recovery_target_time stops (or end, when there is none yet). It finds,
// by pg_control's versions, the last checkpoint that began at least a
// second before the time (every transaction that committed before its
// REDO point committed before that time), then reads the WAL from there.
func lsnForTime(ctx context.Context, o Options, oldest, end pg.LSN) (pg.LSN, error) {
	t := o.At.Time
	early := func(l pg.LSN) (bool, time.Time, error) {
		ctl, err := o.control(ctx, l)
		if err != nil {
			return false, time.Time{}, fmt.Errorf("restore: %s at %s: %w", ControlFile, l, err)
		}
		at, err := pageserver.ControlCheckpointTime(ctl)
		if err != nil {
			return false, time.Time{}, err
		}
		return !at.Add(time.Second).After(t), at, nil
	}
	ok, first, err := early(oldest)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("%w: %s is before the oldest moment the page history reaches (the checkpoint of %s, at WAL position %s; storage.pitr and storage.gc_horizon say how far back it reaches)", ErrTooOld, o.At, first.Format(time.RFC3339), oldest)
	}
	// The last LSN whose pg_control names a checkpoint a second before t.
	lo, hi := oldest, end
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		ok, _, err := early(mid)
		if err != nil {
			return 0, err
		}
		if ok {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	ctl, err := o.control(ctx, lo)
	if err != nil {
		return 0, err
	}
	c, err := agent.ParseControl(ctl)
	if err != nil {
		return 0, err
	}
	src := o.WAL
	src.SystemID = c.SystemID
	s := &segments{ctx: ctx, src: src, tli: c.Timeline, end: end}
	rd := wal.NewReader(s, c.Redo)
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			return end, nil
		}
		if err != nil {
			return 0, fmt.Errorf("restore: reading WAL from %s for %s: %w", c.Redo, o.At, err)
		}
		if at, ok := xactTime(r); ok && at.After(t) {
			return r.LSN, nil
		}
	}
}

// xl_xact info values (the opmask bits) of the records that end a
// transaction, which Postgres' recovery_target_time looks at.
const (
	xactOpmask         = 0x70
	xactCommit         = 0x00
	xactAbort          = 0x20
	xactCommitPrepared = 0x30
	xactAbortPrepared  = 0x40
)

// pgEpoch is PostgreSQL's timestamp epoch.
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// xactTime returns the time stamped on a commit or abort record.
func xactTime(r *wal.Record) (time.Time, bool) {
	if r.RmID != wal.RmXact || len(r.MainData) < 8 {
		return time.Time{}, false
	}
	switch r.Info & xactOpmask {
	case xactCommit, xactAbort, xactCommitPrepared, xactAbortPrepared:
	default:
		return time.Time{}, false
	}
	us := int64(binary.LittleEndian.Uint64(r.MainData))
	return pgEpoch.Add(time.Duration(us) * time.Microsecond), true
}
