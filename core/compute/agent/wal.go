package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/pgcontrol"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// ControlFile is PGDATA's pg_control, relative to the data directory.
const ControlFile = "global/pg_control"

// ErrControl: pg_control is missing or not a PostgreSQL 15 control file.
var ErrControl = errors.New("agent: bad pg_control")

// Control is what the agent needs from pg_control (ControlFileData of
// PostgreSQL 15 on a little-endian 64-bit machine).
type Control struct {
	SystemID uint64
	State    uint32
	// Checkpoint is the location of the last checkpoint record.
	Checkpoint pg.LSN
	// Redo is that checkpoint's REDO point R: crash recovery replays WAL
	// from there.
	Redo     pg.LSN
	Timeline pg.PGTimeline
}

// ParseControl decodes the fields of pg_control the agent uses.
func ParseControl(b []byte) (Control, error) {
	if len(b) < 56 {
		return Control{}, fmt.Errorf("%w: %d bytes", ErrControl, len(b))
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[8:12]); v != pgcontrol.Version {
		return Control{}, fmt.Errorf("%w: pg_control_version %d, want %d (PostgreSQL 15)", ErrControl, v, pgcontrol.Version)
	}
	c := Control{
		SystemID:   le.Uint64(b[0:8]),
		State:      le.Uint32(b[16:20]),
		Checkpoint: pg.LSN(le.Uint64(b[32:40])),
		Redo:       pg.LSN(le.Uint64(b[40:48])),
		Timeline:   pg.PGTimeline(le.Uint32(b[48:52])),
	}
	if c.Redo == 0 || c.Redo > c.Checkpoint || c.Timeline == 0 {
		return Control{}, fmt.Errorf("%w: checkpoint %s, redo %s, timeline %d", ErrControl, c.Checkpoint, c.Redo, c.Timeline)
	}
	return c, nil
}

// pg_control's DBState values the agent uses, and where its CRC-32C (over
// the bytes before it) lies in PostgreSQL 15's ControlFileData.
const (
	dbShutdowned           = 1
	dbShutdownedInRecovery = 2
	dbInProduction         = 6
)

// ForceCrashRecovery returns a copy of the pg_control b with the state of
// a running server (DB_IN_PRODUCTION) and its CRC updated: Postgres then
// runs crash recovery from the checkpoint's REDO point to the end of
// pg_wal at its next start instead of trusting a clean shutdown.
func ForceCrashRecovery(b []byte) ([]byte, error) {
	return rewriteControl(b, func(out []byte) { binary.LittleEndian.PutUint32(out[16:], dbInProduction) })
}

// WithSystemID returns a copy of the pg_control b with system identifier
// id and its CRC updated.
func WithSystemID(b []byte, id uint64) ([]byte, error) {
	return rewriteControl(b, func(out []byte) { binary.LittleEndian.PutUint64(out[0:], id) })
}

// rewriteControl checks the pg_control b (fields and CRC) and returns a
// copy that change edits, with its CRC updated.
func rewriteControl(b []byte, change func(out []byte)) ([]byte, error) {
	if _, err := ParseControl(b); err != nil {
		return nil, err
	}
	out, err := pgcontrol.Rewrite(b, change)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrControl, err)
	}
	return out, nil
}

// RecordsAfter reports whether the WAL in dir (pg_wal) holds a record
// after the one at checkpoint that starts below end.
func RecordsAfter(dir string, checkpoint, end pg.LSN) (bool, error) {
	src, err := wal.OpenDir(dir)
	if err != nil {
		return false, err
	}
	defer src.Close()
	r := wal.NewReader(src, checkpoint)
	if _, err := r.Next(); err != nil {
		return false, fmt.Errorf("agent: reading the checkpoint record at %s: %w", checkpoint, err)
	}
	rec, err := r.Next()
	if errors.Is(err, wal.ErrEndOfWAL) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return rec.LSN < end, nil
}

// WALSource says where the agent fetches WAL for pg_wal.
type WALSource struct {
	// Safekeepers are gRPC addresses.
	Safekeepers []string
	// Archive holds archived WAL (nil: safekeepers only), under Prefix.
	Archive objectstore.Store
	Prefix  string
	// SegmentSize defaults to 16 MiB.
	SegmentSize uint64
	// SystemID is the cluster's system identifier (pg_control), which
	// names its WAL in the archive; 0 takes the archive's only one.
	SystemID uint64
	// Progress, when set, is called after each segment written with the
	// count written and the count to write.
	Progress func(done, total int)
}

// FillWAL makes dir (local pg_wal) hold exactly the WAL from the segment
// that contains from up to end, as the safekeeper quorum agreed on it:
// every segment file already there is removed (a crashed compute's local
// WAL may run past end, and WAL past the durable end must not be replayed),
// then the segments from..end are written, each zero-padded past end, which
// Postgres reads as the end of WAL. Files are owned by uid:gid. It returns
// the number of segments written.
func FillWAL(ctx context.Context, src WALSource, dir string, tli pg.PGTimeline, from, end pg.LSN, uid, gid int) (int, error) {
	seg := src.SegmentSize
	if seg == 0 {
		seg = pg.WALSegmentSize
	}
	if err := os.MkdirAll(filepath.Join(dir, "archive_status"), 0o700); err != nil {
		return 0, err
	}
	for _, d := range []string{dir, filepath.Join(dir, "archive_status")} {
		if err := os.Chown(d, uid, gid); err != nil {
			return 0, err
		}
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	for _, e := range ents {
		if _, err := walpos.ParseSegmentName(e.Name(), seg); err == nil || filepath.Ext(e.Name()) == ".partial" || bytes.HasPrefix([]byte(e.Name()), []byte("xlogtemp.")) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return 0, err
			}
		}
	}
	// archive_status entries of removed segments would make Postgres try
	// to archive them; none are needed (the safekeepers archive).
	if sts, err := os.ReadDir(filepath.Join(dir, "archive_status")); err == nil {
		for _, e := range sts {
			_ = os.Remove(filepath.Join(dir, "archive_status", e.Name()))
		}
	}
	if end <= from {
		return 0, nil
	}
	// Each safekeeper (then the archive) in turn is the first choice for
	// every segment, until the WAL written is one unbroken chain of valid
	// records from `from` to its last record end at or below end.
	var errs []error
	for i := range max(1, len(src.Safekeepers)) {
		try := src
		try.Safekeepers = append(append([]string(nil), src.Safekeepers[i:]...), src.Safekeepers[:i]...)
		n, err := fillSegments(ctx, try, dir, tli, from, end, seg, uid, gid)
		if err != nil {
			return n, err
		}
		err = checkWAL(ctx, dir, from, end, seg)
		if err == nil {
			return n, nil
		}
		first := "the archive"
		if len(try.Safekeepers) > 0 {
			first = try.Safekeepers[0]
		}
		errs = append(errs, fmt.Errorf("WAL preferring %s: %w", first, err))
	}
	return 0, fmt.Errorf("%w: %s..%s: %w", ErrWALBroken, from, end, errors.Join(errs...))
}

// ErrWALBroken: the WAL up to the durable end is not one chain of valid
// records on any source; starting Postgres on it would end recovery early
// and lose acknowledged commits, so the agent refuses.
var ErrWALBroken = errors.New("agent: the WAL up to the durable end is broken")

// checkWAL walks the records of the WAL in dir from `from` (a record start:
// a checkpoint's REDO point), verifying each (length, page headers, back
// link, CRC), and fails when the chain ends before the last record end at
// or below end: a hole or a damaged record that Postgres' recovery would
// stop at.
func checkWAL(ctx context.Context, dir string, from, end pg.LSN, seg uint64) error {
	src, err := wal.OpenDir(dir)
	if err != nil {
		return err
	}
	defer src.Close()
	read := func(_ context.Context, a, b pg.LSN) ([]byte, error) {
		buf := make([]byte, wal.PageSize)
		page := a / wal.PageSize * wal.PageSize
		if err := src.ReadPage(page, buf); err != nil {
			return nil, err
		}
		return buf[a-page : b-page], nil
	}
	src2, err := wal.OpenDir(dir)
	if err != nil {
		return err
	}
	defer src2.Close()
	r := wal.NewReader(src2, from)
	reached := from
	var broke error
	for reached < end {
		rec, err := r.Next()
		if err != nil {
			broke = err
			break
		}
		if rec.EndLSN > end {
			break // cut by the durable end
		}
		reached = pg.LSN((uint64(rec.EndLSN) + 7) &^ 7)
	}
	if reached >= end {
		// Every record up to the end: pg_switch_wal's takes the rest of
		// its segment, whose zero padding no backward search reads.
		return nil
	}
	want, err := walpos.RecordEndAtOrBelow(ctx, read, end, from, seg)
	if err != nil {
		return err
	}
	if reached < want {
		if broke == nil {
			broke = fmt.Errorf("a record crosses %s", want)
		}
		return fmt.Errorf("the records end at %s, the last record ends at %s: %w", reached, want, broke)
	}
	return nil
}

// fillSegments writes the segments of [from, end) into dir (see FillWAL).
func fillSegments(ctx context.Context, src WALSource, dir string, tli pg.PGTimeline, from, end pg.LSN, seg uint64, uid, gid int) (int, error) {
	n := 0
	first := from.Segment(seg)
	total := int((uint64(end)+seg-1)/seg - first)
	for no := first; no*seg < uint64(end); no++ {
		name := walpos.FormatSegmentName(tli, no, seg)
		data, err := fetchSegment(ctx, src, name, pg.LSN(no*seg), min(pg.LSN((no+1)*seg), end), seg)
		if err != nil {
			return n, err
		}
		p := filepath.Join(dir, name)
		tmp := p + ".strata-tmp"
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			return n, err
		}
		if err := os.Chown(tmp, uid, gid); err != nil {
			return n, err
		}
		if err := os.Rename(tmp, p); err != nil {
			return n, err
		}
		n++
		if src.Progress != nil {
			src.Progress(n, total)
		}
	}
	return n, nil
}

// fetchSegment returns one whole segment holding the WAL [start, end) and
// zeros after it: from the first safekeeper that holds that range, else
// from the archive (a whole archived segment, cut at end).
func fetchSegment(ctx context.Context, src WALSource, name string, start, end pg.LSN, seg uint64) ([]byte, error) {
	var errs []error
	for _, addr := range src.Safekeepers {
		data, err := readSafekeeper(ctx, addr, start, end)
		if err == nil {
			return append(data, make([]byte, int(seg)-len(data))...), nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if src.Archive != nil {
		var buf bytes.Buffer
		err := safekeeper.FetchSegment(ctx, safekeeper.FetchOptions{Archive: src.Archive, Prefix: src.Prefix, SystemID: src.SystemID, SegmentSize: seg}, name, &buf)
		if err == nil && buf.Len() == int(seg) {
			b := buf.Bytes()
			clear(b[end-start:])
			return b, nil
		}
		if err == nil {
			err = fmt.Errorf("archive returned %d bytes", buf.Len())
		}
		errs = append(errs, fmt.Errorf("archive: %w", err))
	}
	return nil, fmt.Errorf("agent: WAL %s..%s (segment %s): %w", start, end, name, errors.Join(errs...))
}

// readSafekeeper reads WAL [start, end) from one safekeeper (up to its flush
// LSN: after the election every voter holds WAL up to E).
func readSafekeeper(ctx context.Context, addr string, start, end pg.LSN) ([]byte, error) {
	c, err := server.Dial(addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	st, err := c.Status(ctx)
	if err != nil {
		return nil, err
	}
	if st.StartLSN > start || st.FlushLSN < end {
		return nil, fmt.Errorf("holds %s..%s", st.StartLSN, st.FlushLSN)
	}
	data := make([]byte, 0, end-start)
	err = c.ReadWAL(ctx, start, end, server.BoundFlush, func(_ pg.LSN, d []byte) error {
		data = append(data, d...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(data) != int(end-start) {
		return nil, fmt.Errorf("read %d bytes of %s..%s", len(data), start, end)
	}
	return data, nil
}

// FetchSegment returns segment no of PostgreSQL timeline tli, whole and
// holding the WAL below end only (zeros after it): from the first of
// src.Safekeepers that holds that range, else from the archive. It is
// FillWAL's fetch, for a reader that walks WAL a segment at a time.
func FetchSegment(ctx context.Context, src WALSource, tli pg.PGTimeline, no uint64, end pg.LSN) ([]byte, error) {
	seg := src.SegmentSize
	if seg == 0 {
		seg = pg.WALSegmentSize
	}
	start := pg.LSN(no * seg)
	if end <= start {
		return nil, fmt.Errorf("agent: segment %d starts at or after the end %s", no, end)
	}
	return fetchSegment(ctx, src, walpos.FormatSegmentName(tli, no, seg), start, min(pg.LSN((no+1)*seg), end), seg)
}
