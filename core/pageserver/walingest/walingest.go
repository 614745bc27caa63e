// Package walingest feeds a pageserver timeline from PostgreSQL 15 WAL: it
// reads WAL pages from any wal.Source (pg_wal segments, a byte stream from
// the safekeepers), decodes the records with plugins/redo/postgres/wal and
// turns each into timeline versions through ingest.Apply:
//
//   - a block reference with an applied full page image becomes an image of
//     the page at the record's end LSN (the page LSN set to that end LSN, as
//     Postgres' redo does);
//   - any other block reference becomes a delta (WillInit when the record
//     initializes the page) whose data is the whole record, see EncodeDelta;
//     the visibility-map pages that heap records clear implicitly get the
//     same delta; Redo materializes such chains with a sdk/redo engine;
//   - blocks past a relation's end extend it (ingest.Apply);
//   - SMGR CREATE creates an empty fork, SMGR TRUNCATE shrinks the main fork
//     and the visibility map, Database DROP drops every relation of the
//     database, RelMap UPDATE writes pg_filenode.map.
//
// Not handled (see docs/design/pageserver.md, "WAL ingest"): CLOG and other
// SLRU pages, the FSM's size after a truncation, the partial VM page clear
// of a truncation, CREATE DATABASE with the FILE_COPY strategy (an error).
package walingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/ingest"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
	"github.com/stratadb/strata/sdk/replication"
)

// Sentinel errors.
var (
	// ErrUnsupported: a record needs an operation this package does not do.
	ErrUnsupported = errors.New("walingest: unsupported record")
	// ErrBadDelta: a stored delta is not an EncodeDelta value.
	ErrBadDelta = errors.New("walingest: malformed delta")
)

const (
	defaultTablespace = 1663
	globalTablespace  = 1664
)

// EncodeDelta is the delta value stored for a record: its start LSN and end
// LSN (8 bytes each, big endian) followed by the raw record.
func EncodeDelta(r *wal.Record) []byte {
	b := make([]byte, 16+len(r.Raw))
	binary.BigEndian.PutUint64(b, uint64(r.LSN))
	binary.BigEndian.PutUint64(b[8:], uint64(r.EndLSN))
	copy(b[16:], r.Raw)
	return b
}

// DecodeDelta parses an EncodeDelta value; Data aliases b.
func DecodeDelta(b []byte) (redo.Record, error) {
	if len(b) < 16+wal.RecordHeaderSize {
		return redo.Record{}, fmt.Errorf("%w: %d bytes", ErrBadDelta, len(b))
	}
	return redo.Record{LSN: pg.LSN(binary.BigEndian.Uint64(b)), EndLSN: pg.LSN(binary.BigEndian.Uint64(b[8:])), Data: b[16:]}, nil
}

// Convert turns the page-level effects of r into an ingest.Record at
// r.EndLSN: images for applied FPIs, deltas for the other block references
// and for implicit VM clears, and pg_filenode.map for RelMap updates.
// File-level operations (create, truncate, drop) are left to the Ingester.
func Convert(r *wal.Record) (ingest.Record, error) {
	out := ingest.Record{LSN: r.EndLSN}
	var delta []byte
	seen := map[pg.PageKey]bool{}
	for i := range r.Blocks {
		b := &r.Blocks[i]
		seen[b.Page] = true
		if b.ApplyImage {
			img := make([]byte, pg.BlockSize)
			// RedoBlock restores the image and sets the page LSN.
			if err := postgres.RedoBlock(r, b, img, postgres.Options{}); err != nil {
				return out, fmt.Errorf("walingest: image of %s at %s: %w", b.Page, r.LSN, err)
			}
			out.Blocks = append(out.Blocks, ingest.BlockChange{Page: b.Page, Kind: layer.Image, Data: img})
			continue
		}
		if delta == nil {
			delta = EncodeDelta(r)
		}
		k := layer.Delta
		if b.WillInit() {
			k = layer.WillInit
		}
		out.Blocks = append(out.Blocks, ingest.BlockChange{Page: b.Page, Kind: k, Data: delta})
	}
	for _, c := range postgres.VMClears(r) {
		if seen[c.Page] {
			continue
		}
		seen[c.Page] = true
		if delta == nil {
			delta = EncodeDelta(r)
		}
		out.Blocks = append(out.Blocks, ingest.BlockChange{Page: c.Page, Kind: layer.Delta, Data: delta})
	}
	u, ok, err := postgres.RelMap(r)
	if err != nil {
		return out, fmt.Errorf("walingest: %w", err)
	}
	if ok {
		out.Files = append(out.Files, ingest.FileBlock{Path: relMapPath(u.Spc, u.DB), Data: append([]byte(nil), u.File...)})
	}
	return out, nil
}

func relMapPath(spc, db uint32) string {
	if spc == globalTablespace {
		return "global/pg_filenode.map"
	}
	return fmt.Sprintf("base/%d/pg_filenode.map", db)
}

// Redo adapts a sdk/redo engine to timeline.Redo for EncodeDelta deltas
// of relation pages. It is safe for concurrent use if the engine is.
type Redo struct{ Engine redo.Redoer }

var _ timeline.Redo = Redo{}

// Apply implements timeline.Redo.
func (r Redo) Apply(key keyspace.Key, lsn pg.LSN, base []byte, records [][]byte) ([]byte, error) {
	if !key.IsRelBlock() {
		return nil, fmt.Errorf("%w: delta on non-relation key %s", ErrBadDelta, key)
	}
	if base == nil {
		// WillInit chains: a record that initializes the page, or one that
		// Postgres' redo applies to the zeroed page it extends the relation
		// with (see applier.extend).
		base = make([]byte, pg.BlockSize)
	}
	req := redo.Request{Key: key.PageKey(), Base: base}
	for _, d := range records {
		rr, err := DecodeDelta(d)
		if err != nil {
			return nil, err
		}
		req.Records = append(req.Records, rr)
	}
	res, err := r.Engine.Redo(context.Background(), []redo.Request{req})
	if err != nil {
		return nil, err
	}
	if len(res) != 1 {
		return nil, fmt.Errorf("walingest: redo engine answered %d results for 1 request", len(res))
	}
	return res[0].Page, res[0].Err
}

// Ingester applies WAL to one timeline. Its fields are set before Run and
// not changed after; one Run at a time.
type Ingester struct {
	TL *timeline.Timeline
	// Feedback (may be nil) receives the timeline's positions after every
	// applied batch.
	Feedback ingest.Feedback
	// BatchSize is the number of records per timeline.Ingest call (0: 256).
	BatchSize int
}

// Run reads records from src starting at the first record at or after
// start and applies them until src reports the end of WAL (returns the end
// LSN of the last applied record and nil) or fails, or ctx ends.
func (in *Ingester) Run(ctx context.Context, src wal.Source, start pg.LSN) (pg.LSN, error) {
	rd := wal.NewReader(src, start)
	a := &applier{in: in}
	for {
		if err := ctx.Err(); err != nil {
			return a.end, err
		}
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			return a.end, a.flush(ctx)
		}
		if err != nil {
			return a.end, err
		}
		if err := a.add(ctx, r); err != nil {
			return a.end, err
		}
	}
}

// applier batches converted records for one Ingester.
type applier struct {
	in    *Ingester
	batch []ingest.Record
	end   pg.LSN               // the end LSN of the last record added
	sizes map[pg.RelTag]uint32 // relation sizes with the batch applied
	clog  map[uint32][]byte    // pg_xact pages changed in the batch, by page number
}

// clogPath returns the pg_xact segment file and block of a CLOG page.
func clogPath(pageno uint32) (string, uint32) {
	return fmt.Sprintf("pg_xact/%04X", pageno/slruPagesPerSegment), pageno % slruPagesPerSegment
}

const slruPagesPerSegment = 32

func (a *applier) clogPage(ctx context.Context, pageno uint32) ([]byte, error) {
	if p, ok := a.clog[pageno]; ok {
		return p, nil
	}
	path, blk := clogPath(pageno)
	page := make([]byte, pg.BlockSize)
	p, err := a.in.TL.Get(ctx, keyspace.FileBlock(path, blk), timeline.LatestLSN)
	switch {
	case err == nil:
		copy(page, p)
	case !errors.Is(err, timeline.ErrNotFound):
		return nil, err
	}
	if a.clog == nil {
		a.clog = map[uint32][]byte{}
	}
	a.clog[pageno] = page
	return page, nil
}

// xact adds to rec the pg_xact pages r changes: transaction status on
// commit and abort, a zeroed page on CLOG ZEROPAGE. Each changed page is
// stored whole at the record's LSN.
func (a *applier) xact(ctx context.Context, r *wal.Record, rec *ingest.Record) error {
	if pn, ok := postgres.CLOGZeroPage(r); ok {
		if a.clog == nil {
			a.clog = map[uint32][]byte{}
		}
		a.clog[pn] = make([]byte, pg.BlockSize)
		path, blk := clogPath(pn)
		rec.Files = append(rec.Files, ingest.FileBlock{Path: path, Block: blk, Data: make([]byte, pg.BlockSize)})
		return nil
	}
	ch, ok, err := postgres.XactStatusChange(r)
	if err != nil || !ok {
		return err
	}
	done := map[uint32]bool{}
	for _, x := range ch.XIDs {
		pn := postgres.CLOGPageOf(x)
		if done[pn] {
			continue
		}
		done[pn] = true
		page, err := a.clogPage(ctx, pn)
		if err != nil {
			return err
		}
		postgres.SetXactStatus(ch, pn, page)
		path, blk := clogPath(pn)
		rec.Files = append(rec.Files, ingest.FileBlock{Path: path, Block: blk, Data: bytes.Clone(page)})
	}
	return nil
}

func (a *applier) size(ctx context.Context, rel pg.RelTag) (uint32, error) {
	if n, ok := a.sizes[rel]; ok {
		return n, nil
	}
	n, _, err := a.in.TL.Nblocks(ctx, rel, timeline.LatestLSN)
	if err != nil {
		return 0, err
	}
	if a.sizes == nil {
		a.sizes = map[pg.RelTag]uint32{}
	}
	a.sizes[rel] = n
	return n, nil
}

// extend does what Postgres' redo does to a block past the relation's end
// (XLogReadBufferExtended): the relation grows with zeroed pages, and the
// record is applied to a zeroed page. The skipped pages get zero images;
// a delta on the new page becomes WillInit (Redo starts it from zeros).
func (a *applier) extend(ctx context.Context, rec *ingest.Record) error {
	var out []ingest.BlockChange
	for _, b := range rec.Blocks {
		rel := b.Page.Tag()
		n, err := a.size(ctx, rel)
		if err != nil {
			return err
		}
		if b.Page.Block >= n {
			for blk := n; blk < b.Page.Block; blk++ {
				out = append(out, ingest.BlockChange{Page: rel.Page(blk), Kind: layer.Image, Data: make([]byte, pg.BlockSize)})
			}
			if b.Kind == layer.Delta {
				b.Kind = layer.WillInit
			}
			a.sizes[rel] = b.Page.Block + 1
		}
		out = append(out, b)
	}
	rec.Blocks = out
	return nil
}

func (a *applier) flush(ctx context.Context) error {
	if len(a.batch) == 0 {
		return nil
	}
	if err := ingest.Apply(ctx, a.in.TL, a.batch, a.end); err != nil {
		return err
	}
	a.batch = a.batch[:0]
	clear(a.sizes)
	clear(a.clog)
	if a.in.Feedback != nil {
		a.in.Feedback.Report(a.in.TL.ID(), a.in.TL.LSNs())
	}
	return nil
}

// add converts r (which may be reused by the reader after the call) and
// applies the batch when it is full or r is a file-level operation.
func (a *applier) add(ctx context.Context, r *wal.Record) error {
	bs := a.in.BatchSize
	if bs <= 0 {
		bs = 256
	}
	ops, err := postgres.FileOps(r)
	if err != nil {
		return err
	}
	tr, isTrunc, err := postgres.SMGRTruncation(r)
	if err != nil {
		return err
	}
	fileLevel := len(ops) > 0 || isTrunc
	var rels []ingest.RelChange
	var extra []ingest.BlockChange
	var files []ingest.FileBlock
	if fileLevel {
		// File-level operations look at the timeline: apply what precedes.
		if err := a.flush(ctx); err != nil {
			return err
		}
		if rels, err = a.in.fileOps(ctx, r, ops, tr, isTrunc, &extra, &files); err != nil {
			return err
		}
	}
	rec, err := Convert(r)
	if err != nil {
		return err
	}
	rec.Rels = append(rels, rec.Rels...)
	rec.Blocks = append(rec.Blocks, extra...)
	rec.Files = append(rec.Files, files...)
	if fileLevel {
		clear(a.sizes)
	}
	for _, rc := range rec.Rels {
		if a.sizes == nil {
			a.sizes = map[pg.RelTag]uint32{}
		}
		a.sizes[rc.Rel] = rc.Nblocks // 0 when dropped
	}
	if err := a.extend(ctx, &rec); err != nil {
		return err
	}
	if err := a.xact(ctx, r, &rec); err != nil {
		return err
	}
	a.end = r.EndLSN
	a.batch = append(a.batch, rec)
	if fileLevel || len(a.batch) >= bs {
		return a.flush(ctx)
	}
	return nil
}

// unlink removes non-relation files at lsn (the record's end) when they exist.
func (in *Ingester) unlink(ctx context.Context, lsn pg.LSN, paths ...string) error {
	var cs []timeline.Change
	for _, path := range paths {
		size, ok, err := in.TL.StatFile(ctx, path, timeline.LatestLSN)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		cs = append(cs, timeline.Change{Key: keyspace.FileMeta(path), LSN: lsn, Kind: layer.Tombstone})
		for blk := int64(0); blk*pg.BlockSize < size; blk++ {
			cs = append(cs, timeline.Change{Key: keyspace.FileBlock(path, uint32(blk)), LSN: lsn, Kind: layer.Tombstone})
		}
	}
	if len(cs) == 0 {
		return nil
	}
	return in.TL.Ingest(ctx, cs, lsn)
}

// fileOps returns the relation changes of a record's file-level operations
// and appends to extra and files the page images and file blocks they
// imply. It removes the files of a dropped database itself.
func (in *Ingester) fileOps(ctx context.Context, r *wal.Record, ops []postgres.FileOp, tr postgres.Truncation, isTrunc bool, extra *[]ingest.BlockChange, files *[]ingest.FileBlock) ([]ingest.RelChange, error) {
	var out []ingest.RelChange
	for _, op := range ops {
		switch op.Kind {
		case "create-fork":
			_, exists, err := in.TL.Nblocks(ctx, op.Rel, timeline.LatestLSN)
			if err != nil {
				return nil, err
			}
			if !exists {
				out = append(out, ingest.RelChange{Rel: op.Rel, Nblocks: 0})
			}
		case "create-database":
			if op.SrcDB != 0 {
				return nil, fmt.Errorf("%w: CREATE DATABASE with the FILE_COPY strategy at %s", ErrUnsupported, r.LSN)
			}
			// WAL_LOG strategy: the pages follow as images; the redo of this
			// record creates the database directory and its PG_VERSION.
			for _, spc := range op.Spcs {
				if spc == defaultTablespace {
					*files = append(*files, ingest.FileBlock{Path: fmt.Sprintf("base/%d/PG_VERSION", op.DB), Data: []byte("15\n")})
				}
			}
		case "drop-database":
			for _, spc := range op.Spcs {
				rels, err := in.TL.ListRels(ctx, keyspace.DBRange(spc, op.DB), timeline.LatestLSN)
				if err != nil {
					return nil, err
				}
				for _, rel := range rels {
					out = append(out, ingest.RelChange{Rel: rel, Drop: true})
				}
				if spc == defaultTablespace {
					if err := in.unlink(ctx, r.EndLSN, fmt.Sprintf("base/%d/PG_VERSION", op.DB), relMapPath(spc, op.DB)); err != nil {
						return nil, err
					}
				}
			}
		}
	}
	if isTrunc {
		if tr.Flags&postgres.TruncateHeap != 0 {
			out = append(out, ingest.RelChange{Rel: tr.Rel, Nblocks: tr.Blocks})
		}
		if tr.Flags&postgres.TruncateVM != 0 {
			vm := tr.Rel
			vm.Fork = pg.VMFork
			n, exists, err := in.TL.Nblocks(ctx, vm, timeline.LatestLSN)
			if err != nil {
				return nil, err
			}
			nb, partial := postgres.VMBlocksAfterTruncate(tr.Blocks)
			if exists && nb < n {
				out = append(out, ingest.RelChange{Rel: vm, Nblocks: nb})
			}
			if exists && partial && nb-1 < n {
				// visibilitymap_prepare_truncate clears the bits of the cut
				// heap blocks in the last VM page, without WAL of its own.
				pk := vm.Page(nb - 1)
				p, err := in.TL.Get(ctx, keyspace.RelBlock(pk), timeline.LatestLSN)
				switch {
				case errors.Is(err, timeline.ErrNotFound) || errors.Is(err, timeline.ErrMissingBase):
					// The page is not here: nothing to clear.
				case err != nil:
					return nil, err
				default:
					img := bytes.Clone(p)
					postgres.VMTruncatePage(img, tr.Blocks)
					*extra = append(*extra, ingest.BlockChange{Page: pk, Kind: layer.Image, Data: img})
				}
			}
		}
	}
	return out, nil
}

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
	a := &applier{in: &c}
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

// trim forgets the pages before the one holding lsn.
func (l *liveWAL) trim(lsn pg.LSN) {
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
