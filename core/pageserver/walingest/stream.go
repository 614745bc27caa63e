package walingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/ingest"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/replication"
)

// StreamFeedback reports a timeline's positions to a replication stream:
// Received is the last ingested record, Durable what survives a restart,
// Uploaded the remote consistent LSN.
type StreamFeedback struct{ Stream replication.Stream }

var _ ingest.Feedback = StreamFeedback{}

// Report implements ingest.Feedback. Errors are dropped: feedback is
// advisory and sent again after the next batch.
func (f StreamFeedback) Report(_ pg.TimelineID, l timeline.LSNs) {
	_ = f.Stream.Feedback(replication.Progress{Received: l.LastRecord, Durable: l.Durable, Uploaded: l.RemoteConsistent})
}

type feedbacks []ingest.Feedback

func (fs feedbacks) Report(tl pg.TimelineID, l timeline.LSNs) {
	for _, f := range fs {
		if f != nil {
			f.Report(tl, l)
		}
	}
}

// RunStream follows committed WAL streamed from src (the safekeepers) as
// consumer, from the first record at or after start, and also reports
// progress to the stream (StreamFeedback). Records are applied as soon as
// they are entirely received, even when their WAL page is not yet full. It
// runs until ctx ends (the result is then ctx's error), the stream fails
// (its error) or a record cannot be applied.
func (in *Ingester) RunStream(ctx context.Context, src replication.Source, consumer string, start pg.LSN) (pg.LSN, error) {
	if start%8 != 0 {
		// Inside a record (records start 8-byte aligned): the reader
		// would take any 4 bytes there for a record's length and could
		// wait forever for a record that never comes.
		return 0, fmt.Errorf("%w: cannot resume WAL ingest at %s: not the start of a WAL record (the timeline's last record LSN must be the end of a record)", wal.ErrCorrupt, start)
	}
	from := start - start%wal.PageSize
	st, err := src.Stream(ctx, consumer, from)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	c := *in
	c.Feedback = feedbacks{in.Feedback, StreamFeedback{Stream: st}}
	a := newApplier(&c)
	live := &liveWAL{base: from}
	next := start
	for {
		ch, err := st.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return a.end, ctx.Err()
			}
			return a.end, err
		}
		if err := live.append(ch.Start, ch.Data); err != nil {
			return a.end, err
		}
		// A new reader: the previous one may hold a partial page.
		rd := wal.NewReader(live, next)
		for live.complete(rd.NextLSN()) {
			r, err := rd.Next()
			if errors.Is(err, wal.ErrEndOfWAL) {
				break
			}
			if err != nil {
				return a.end, err
			}
			if err := a.add(ctx, r); err != nil {
				return a.end, err
			}
			next = rd.NextLSN()
		}
		if err := a.flush(ctx); err != nil {
			return a.end, err
		}
		live.trim(next)
	}
}

// liveWAL holds the streamed WAL from base (a page boundary) to the
// received end and serves pages zero-padded past that end.
type liveWAL struct {
	base pg.LSN
	data []byte
}

func (l *liveWAL) SegmentSize() uint64 { return pg.WALSegmentSize }

func (l *liveWAL) end() pg.LSN { return l.base + pg.LSN(len(l.data)) }

func (l *liveWAL) append(start pg.LSN, b []byte) error {
	end := start + pg.LSN(len(b))
	if start > l.end() || end < l.end() {
		return fmt.Errorf("walingest: chunk %s..%s does not continue the stream at %s", start, end, l.end())
	}
	l.data = append(l.data, b[l.end()-start:]...)
	return nil
}

// trim forgets the pages before the one holding lsn, and never the page
// holding the received end: after a WAL switch record lsn is the start of
// the next segment, past what the stream has sent so far (it still sends
// the rest of the switched segment), and append must go on at the end.
func (l *liveWAL) trim(lsn pg.LSN) {
	lsn = min(lsn, l.end())
	p := lsn - lsn%wal.PageSize
	if p <= l.base {
		return
	}
	l.data = append(l.data[:0], l.data[p-l.base:]...)
	l.base = p
}

func (l *liveWAL) ReadPage(lsn pg.LSN, buf []byte) error {
	if lsn < l.base {
		return fmt.Errorf("%w: page %s is no longer held", wal.ErrCorrupt, lsn)
	}
	if lsn >= l.end() {
		return fmt.Errorf("%w: page %s not received yet", wal.ErrEndOfWAL, lsn)
	}
	n := copy(buf[:wal.PageSize], l.data[lsn-l.base:])
	clear(buf[n:wal.PageSize])
	return nil
}

// complete reports whether the whole record at pos (past the page header
// when pos is a page boundary) has been received, or an end-of-WAL marker
// (a record length below a header's) has: then the reader may look at it.
func (l *liveWAL) complete(pos pg.LSN) bool {
	end := l.end()
	bytesAt := func(p pg.LSN, n int) []byte {
		if p < l.base || p+pg.LSN(n) > end {
			return nil
		}
		return l.data[p-l.base : p-l.base+pg.LSN(n)]
	}
	header := func(page pg.LSN) pg.LSN {
		b := bytesAt(page, 4)
		if b == nil {
			return 0
		}
		if binary.LittleEndian.Uint16(b[2:])&xlpLongHeader != 0 {
			return longHeaderSize
		}
		return shortHeaderSize
	}
	if pos%wal.PageSize == 0 {
		h := header(pos)
		if h == 0 {
			return false
		}
		pos += h
	}
	b := bytesAt(pos, 4)
	if b == nil {
		return false
	}
	need := pg.LSN(binary.LittleEndian.Uint32(b))
	if need < wal.RecordHeaderSize || need > maxRecordSize {
		return true // the reader reports it; do not wait for it
	}
	for {
		room := wal.PageSize - pos%wal.PageSize
		if need <= room {
			return pos+need <= end
		}
		need -= room
		pos += room
		h := header(pos)
		if h == 0 {
			return false
		}
		pos += h
	}
}

// WAL page header sizes (MAXALIGNed XLogPageHeaderData and
// XLogLongPageHeaderData) and XLP_LONG_HEADER.
const (
	maxRecordSize   = 1020 << 20 // the reader's limit (XLogRecordMaxSize)
	shortHeaderSize = 24
	longHeaderSize  = 40
	xlpLongHeader   = 0x0002
)

// Follow runs RunStream until ctx ends, reopening the stream with backoff
// (100 ms doubling to 10 s) after it fails. Each attempt starts at the
// timeline's last record LSN (the end of the last ingested record, where
// the next begins), or at start when the timeline has not reached it. It
// returns ctx's error, or timeline.ErrClosed when the timeline is closed.
func (in *Ingester) Follow(ctx context.Context, src replication.Source, consumer string, start pg.LSN, log zerolog.Logger) error {
	backoff := 100 * time.Millisecond
	for {
		from := max(start, in.TL.LSNs().LastRecord)
		_, err := in.RunStream(ctx, src, consumer, from)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, timeline.ErrClosed) {
			return err
		}
		log.Warn().Err(err).Stringer("from", from).Dur("retry_in", backoff).Msg("walingest: WAL stream interrupted")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}
