// Package walingest feeds a pageserver timeline from PostgreSQL 15 WAL: it
// reads WAL pages from any wal.Source (pg_wal segments, a byte stream from
// the safekeepers), decodes the records with plugins/redo/postgres/wal and
// turns each into timeline versions through ingest.Changes:
//
//   - a block reference with an applied full page image becomes an image of
//     the page at the record's end LSN (the page LSN set to that end LSN, as
//     Postgres' redo does);
//   - any other block reference becomes a delta (WillInit when the record
//     initializes the page) whose data is the whole record, see EncodeDelta;
//     the visibility-map pages that heap records clear implicitly get the
//     same delta; Redo materializes such chains with a sdk/redo engine;
//   - blocks past a relation's end extend it (ingest.Changes);
//   - SLRU pages (pg_xact, pg_multixact/offsets and members) get a zeroed
//     image on ZEROPAGE records and a delta (the record) on commits, aborts
//     and multixact creations, which Redo applies with postgres.RedoSLRU;
//   - SMGR CREATE creates an empty fork, SMGR TRUNCATE shrinks the main
//     fork, the visibility map and the free space map, a transaction's
//     commit or abort drops the relations it deleted (or created, on
//     abort), CREATE DATABASE copies the template database (FILE_COPY) or
//     writes PG_VERSION (WAL_LOG), Database DROP drops every relation of
//     the database, RelMap UPDATE writes pg_filenode.map.
//
// Ingested versions are appended to the timeline's log without an fsync
// per batch (timeline.IngestBuffered); the Ingester syncs every SyncBytes
// of WAL and at the end of Run, and the timeline's durable LSN tells the
// safekeepers how far the WAL is safe here.
//
// Not handled (see docs/design/pageserver.md, "WAL ingest"): files in
// non-default tablespaces, CLOG and multixact truncation, the contents of
// free space map pages.
package walingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/stratadb/strata/core/pageserver/ingest"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
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
func EncodeDelta(r *wal.Record) []byte { return encodeDelta(r, nil) }

func encodeDelta(r *wal.Record, ar *arena) []byte {
	b := ar.alloc(16 + len(r.Raw))
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

// arena hands out byte slices carved from large chunks, and hands the
// same memory out again after reset: the timeline copies what it ingests
// (layer.InMem keeps its own copy), so the record copies and restored
// images of a batch are garbage once the batch is applied. Reusing them
// avoids faulting fresh pages in for every megabyte of WAL. A nil arena
// allocates each slice on its own. Not safe for concurrent use.
type arena struct {
	chunks [][]byte
	next   int    // index of the next chunk to use
	buf    []byte // the free tail of the current chunk
}

const arenaChunk = 1 << 20

func (a *arena) alloc(n int) []byte {
	if a == nil || n > arenaChunk/8 {
		return make([]byte, n)
	}
	if len(a.buf) < n {
		if a.next == len(a.chunks) {
			a.chunks = append(a.chunks, make([]byte, arenaChunk))
		}
		a.buf = a.chunks[a.next]
		a.next++
	}
	b := a.buf[:n:n]
	a.buf = a.buf[n:]
	return b
}

// reset makes all the arena's memory available again. REQUIRES: no slice
// it handed out is used any more.
func (a *arena) reset() { a.next, a.buf = 0, nil }

// zeroPage is a shared all-zero page: versions must not be modified, so
// every zeroed image can use it.
var zeroPage = make([]byte, pg.BlockSize)

// Convert turns the page-level effects of r into an ingest.Record at
// r.EndLSN: images for applied FPIs, deltas for the other block references
// and for implicit VM clears, and pg_filenode.map for RelMap updates.
// File-level operations (create, truncate, drop) and SLRU pages are left
// to the Ingester.
func Convert(r *wal.Record) (ingest.Record, error) { return convert(r, nil) }

func convert(r *wal.Record, ar *arena) (ingest.Record, error) {
	out := ingest.Record{LSN: r.EndLSN}
	var delta []byte
	seen := func(pk pg.PageKey) bool {
		for i := range out.Blocks {
			if out.Blocks[i].Page == pk {
				return true
			}
		}
		return false
	}
	if len(r.Blocks) > 0 {
		out.Blocks = make([]ingest.BlockChange, 0, len(r.Blocks))
	}
	for i := range r.Blocks {
		b := &r.Blocks[i]
		if b.ApplyImage {
			img := ar.alloc(pg.BlockSize)
			// RedoBlock restores the image and sets the page LSN.
			if err := postgres.RedoBlock(r, b, img, postgres.Options{}); err != nil {
				return out, fmt.Errorf("walingest: image of %s at %s: %w", b.Page, r.LSN, err)
			}
			out.Blocks = append(out.Blocks, ingest.BlockChange{Page: b.Page, Kind: layer.Image, Data: img})
			continue
		}
		if delta == nil {
			delta = encodeDelta(r, ar)
		}
		k := layer.Delta
		if b.WillInit() {
			k = layer.WillInit
		}
		out.Blocks = append(out.Blocks, ingest.BlockChange{Page: b.Page, Kind: k, Data: delta})
	}
	if r.RmID == wal.RmHeap || r.RmID == wal.RmHeap2 {
		for _, c := range postgres.VMClears(r) {
			if seen(c.Page) {
				continue
			}
			if delta == nil {
				delta = encodeDelta(r, ar)
			}
			out.Blocks = append(out.Blocks, ingest.BlockChange{Page: c.Page, Kind: layer.Delta, Data: delta})
		}
	}
	if r.RmID == wal.RmRelMap {
		u, ok, err := postgres.RelMap(r)
		if err != nil {
			return out, fmt.Errorf("walingest: %w", err)
		}
		if ok {
			out.Files = append(out.Files, ingest.FileBlock{Path: relMapPath(u.Spc, u.DB), Data: bytes.Clone(u.File)})
		}
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
// of relation pages, and applies SLRU deltas (pg_xact, pg_multixact) with
// postgres.RedoSLRU. It is safe for concurrent use if the engine is.
type Redo struct{ Engine redo.Redoer }

var _ timeline.Redo = Redo{}

// Apply implements timeline.Redo.
func (r Redo) Apply(key keyspace.Key, lsn pg.LSN, base []byte, records [][]byte) ([]byte, error) {
	if key.Namespace() == keyspace.NSSLRU && !key.IsMeta() {
		return applySLRU(key, base, records)
	}
	if !key.IsRelBlock() {
		return nil, fmt.Errorf("%w: delta on non-relation key %s", ErrBadDelta, key)
	}
	if base == nil {
		// WillInit chains: a record that initializes the page, or one that
		// Postgres' redo applies to the zeroed page it extends the relation
		// with (see applier.extend).
		base = make([]byte, pg.BlockSize)
	}
	req := redo.Request{Key: key.PageKey(), Base: base, Records: make([]redo.Record, 0, len(records))}
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
	// BatchSize is the number of records per timeline write (0: 1024).
	BatchSize int
	// SyncBytes is how much WAL may be ingested between two fsyncs of the
	// timeline's log (0: 16 MiB; negative: an fsync per batch). Run also
	// syncs at its end, RunStream at least every SyncInterval.
	SyncBytes int64
	// SyncInterval bounds the time between fsyncs while WAL streams in
	// (0: 200 ms).
	SyncInterval time.Duration
}

// Run reads records from src starting at the first record at or after
// start and applies them until src reports the end of WAL (returns the end
// LSN of the last applied record and nil, everything applied durable) or
// fails, or ctx ends.
func (in *Ingester) Run(ctx context.Context, src wal.Source, start pg.LSN) (pg.LSN, error) {
	rd := wal.NewReader(src, start)
	a := newApplier(in)
	for {
		if err := ctx.Err(); err != nil {
			return a.end, err
		}
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			if err := a.flush(ctx); err != nil {
				return a.end, err
			}
			return a.end, a.sync()
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
	end   pg.LSN                // the end LSN of the last record added
	sizes map[pg.RelTag]uint32  // relation sizes with the batch applied
	slru  map[keyspace.Key]bool // SLRU pages known to exist
	// SLRU deltas since the page's last image, and the pages due for one.
	slruDeltas  map[keyspace.Key]int
	materialize []keyspace.Key
	ar          *arena
	synced      pg.LSN    // end of the last batch made durable
	syncAt      time.Time // when
}

func newApplier(in *Ingester) *applier {
	return &applier{in: in, sizes: map[pg.RelTag]uint32{}, slru: map[keyspace.Key]bool{}, slruDeltas: map[keyspace.Key]int{},
		ar: &arena{}, syncAt: time.Now()}
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
	grow := false
	for _, b := range rec.Blocks {
		n, err := a.size(ctx, b.Page.Tag())
		if err != nil {
			return err
		}
		if b.Page.Block >= n {
			grow = true
			break
		}
	}
	if !grow {
		return nil // the common case: nothing to add
	}
	var out []ingest.BlockChange
	for _, b := range rec.Blocks {
		rel := b.Page.Tag()
		n, err := a.size(ctx, rel)
		if err != nil {
			return err
		}
		if b.Page.Block >= n {
			for blk := n; blk < b.Page.Block; blk++ {
				out = append(out, ingest.BlockChange{Page: rel.Page(blk), Kind: layer.Image, Data: zeroPage})
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
	if err := ingest.ApplyBuffered(ctx, a.in.TL, a.batch, a.end); err != nil {
		return err
	}
	clear(a.batch) // drop references to the records' data
	a.batch = a.batch[:0]
	// The timeline copied the versions' data: the arena's memory is free.
	a.ar.reset()
	clear(a.sizes)
	if a.dueSync() {
		if err := a.sync(); err != nil {
			return err
		}
	}
	if a.in.Feedback != nil {
		a.in.Feedback.Report(a.in.TL.ID(), a.in.TL.LSNs())
	}
	return nil
}

func (a *applier) dueSync() bool {
	every := a.in.SyncBytes
	if every == 0 {
		every = 16 << 20
	}
	iv := a.in.SyncInterval
	if iv == 0 {
		iv = 200 * time.Millisecond
	}
	return every < 0 || int64(a.end-a.synced) >= every || time.Since(a.syncAt) >= iv
}

// sync makes everything applied so far durable.
func (a *applier) sync() error {
	if err := a.in.TL.SyncIngested(); err != nil {
		return err
	}
	a.synced, a.syncAt = a.end, time.Now()
	return nil
}

// add converts r (which may be reused by the reader after the call) and
// applies the batch when it is full or r is a file-level operation.
func (a *applier) add(ctx context.Context, r *wal.Record) error {
	bs := a.in.BatchSize
	if bs <= 0 {
		bs = 1024
	}
	var (
		ops     []postgres.FileOp
		tr      postgres.Truncation
		isTrunc bool
		dropped []pg.RelTag
		err     error
	)
	switch r.RmID {
	case wal.RmSmgr, wal.RmDatabase:
		if ops, err = postgres.FileOps(r); err != nil {
			return err
		}
		if tr, isTrunc, err = postgres.SMGRTruncation(r); err != nil {
			return err
		}
	case wal.RmXact:
		if dropped, err = xactDroppedRels(r); err != nil {
			return err
		}
	}
	fileLevel := len(ops) > 0 || isTrunc || len(dropped) > 0
	var rels []ingest.RelChange
	var extra []ingest.BlockChange
	var files []ingest.FileBlock
	var raw []timeline.Change
	if fileLevel {
		// File-level operations look at the timeline: apply what precedes.
		if err := a.flush(ctx); err != nil {
			return err
		}
		if rels, err = a.in.fileOps(ctx, r, ops, tr, isTrunc, dropped, &extra, &files, &raw); err != nil {
			return err
		}
	}
	rec, err := convert(r, a.ar)
	if err != nil {
		return err
	}
	if len(rels) > 0 {
		rec.Rels = append(rels, rec.Rels...)
	}
	rec.Blocks = append(rec.Blocks, extra...)
	rec.Files = append(rec.Files, files...)
	rec.Raw = raw
	if fileLevel {
		clear(a.sizes)
	}
	for _, rc := range rec.Rels {
		a.sizes[rc.Rel] = rc.Nblocks // 0 when dropped
	}
	if err := a.extend(ctx, &rec); err != nil {
		return err
	}
	if err := a.slruChanges(ctx, r, &rec); err != nil {
		return err
	}
	a.end = r.EndLSN
	a.batch = append(a.batch, rec)
	if fileLevel || len(a.batch) >= bs || len(a.materialize) > 0 {
		if err := a.flush(ctx); err != nil {
			return err
		}
	}
	if len(a.materialize) > 0 {
		return a.materializeSLRU(ctx)
	}
	return nil
}
