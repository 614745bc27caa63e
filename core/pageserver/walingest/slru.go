package walingest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/stratadb/strata/core/pageserver/ingest"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// SLRU pages (pg_xact, pg_multixact/offsets, pg_multixact/members) are
// stored as a zeroed image when a ZEROPAGE record starts them and as deltas
// afterwards: each commit, abort or multixact creation stores its record
// (EncodeDelta, a few dozen bytes) on every SLRU page it changes, and Redo
// applies the chain with postgres.RedoSLRU. Storing the changed 8 KiB page
// whole at every commit, as before, made pg_xact most of the ingested bytes.

const slruPagesPerSegment = 32

// slruImageEvery bounds an SLRU page's delta chain: after this many deltas
// the Ingester stores the materialized page as an image, so that reading
// pg_xact never replays more than that many records.
const slruImageEvery = 1024

// Multixact SLRU layout (multixact.c): 4-byte offsets; members in groups
// of four (a flags word, then four xids).
const (
	mxOffsetsPerPage  = pg.BlockSize / 4
	mxMembersPerGroup = 4
	mxGroupSize       = 4 + 4*mxMembersPerGroup
	mxMembersPerPage  = pg.BlockSize / mxGroupSize * mxMembersPerGroup
)

// slruPath returns the segment file and block of SLRU page pageno.
func slruPath(s postgres.SLRU, pageno uint32) (string, uint32) {
	return fmt.Sprintf("%s/%04X", s, pageno/slruPagesPerSegment), pageno % slruPagesPerSegment
}

// clogPath returns the pg_xact segment file and block of a CLOG page.
func clogPath(pageno uint32) (string, uint32) { return slruPath(postgres.SLRUXact, pageno) }

type slruPage struct {
	s      postgres.SLRU
	pageno uint32
}

// slruTouched returns the SLRU pages record r changes, and whether it
// zeroes them (ZEROPAGE records) rather than changing them.
func slruTouched(r *wal.Record) ([]slruPage, bool, error) {
	switch r.RmID {
	case wal.RmCLOG:
		if pn, ok := postgres.CLOGZeroPage(r); ok {
			return []slruPage{{postgres.SLRUXact, pn}}, true, nil
		}
	case wal.RmXact:
		ch, ok, err := postgres.XactStatusChange(r)
		if err != nil || !ok {
			return nil, false, err
		}
		var out []slruPage
		for _, x := range ch.XIDs {
			out = addPage(out, slruPage{postgres.SLRUXact, postgres.CLOGPageOf(x)})
		}
		return out, false, nil
	case wal.RmMultiXact:
		m := r.MainData
		switch r.RmInfo() {
		case 0x00, 0x10: // ZERO_OFF_PAGE, ZERO_MEM_PAGE
			if len(m) < 4 {
				return nil, false, fmt.Errorf("%w: %s at %s too short", ErrUnsupported, postgres.RecordName(r), r.LSN)
			}
			s := postgres.SLRUMultiXactOffsets
			if r.RmInfo() == 0x10 {
				s = postgres.SLRUMultiXactMembers
			}
			return []slruPage{{s, binary.LittleEndian.Uint32(m)}}, true, nil
		case 0x20: // CREATE_ID: offsets of multi and multi+1, the members
			if len(m) < 12 {
				return nil, false, fmt.Errorf("%w: %s at %s too short", ErrUnsupported, postgres.RecordName(r), r.LSN)
			}
			multi, offset := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint32(m[4:])
			n := int(int32(binary.LittleEndian.Uint32(m[8:])))
			if n < 0 || len(m) < 12+8*n {
				return nil, false, fmt.Errorf("%w: %s at %s truncated", ErrUnsupported, postgres.RecordName(r), r.LSN)
			}
			next := multi + 1
			if next < 1 {
				next = 1
			}
			out := []slruPage{{postgres.SLRUMultiXactOffsets, multi / mxOffsetsPerPage}}
			out = addPage(out, slruPage{postgres.SLRUMultiXactOffsets, next / mxOffsetsPerPage})
			for i := 0; i < n; i++ {
				out = addPage(out, slruPage{postgres.SLRUMultiXactMembers, (offset + uint32(i)) / mxMembersPerPage})
			}
			return out, false, nil
		}
	}
	return nil, false, nil
}

func addPage(ps []slruPage, p slruPage) []slruPage {
	for _, q := range ps {
		if q == p {
			return ps
		}
	}
	return append(ps, p)
}

// slruChanges adds to rec the SLRU page versions r makes: a zeroed image
// for a ZEROPAGE record, else a delta per changed page. A page that does
// not exist yet (ingest that started after the page was zeroed, or the
// next multixact offsets page that redo initializes itself) first gets a
// zeroed image at the same LSN, as recovery would find it.
func (a *applier) slruChanges(ctx context.Context, r *wal.Record, rec *ingest.Record) error {
	pages, zero, err := slruTouched(r)
	if err != nil || len(pages) == 0 {
		return err
	}
	var delta []byte
	for _, p := range pages {
		path, blk := slruPath(p.s, p.pageno)
		key := keyspace.FileBlock(path, blk)
		if zero {
			rec.Files = append(rec.Files, ingest.FileBlock{Path: path, Block: blk, Data: zeroPage})
			a.slru[key] = true
			delete(a.slruDeltas, key)
			continue
		}
		ok, err := a.slruExists(ctx, key)
		if err != nil {
			return err
		}
		if !ok {
			rec.Files = append(rec.Files, ingest.FileBlock{Path: path, Block: blk, Data: zeroPage})
			a.slru[key] = true
		}
		if delta == nil {
			delta = encodeDelta(r, a.ar)
		}
		rec.Files = append(rec.Files, ingest.FileBlock{Path: path, Block: blk, Kind: layer.Delta, Data: delta})
		a.slruDeltas[key]++
		if a.slruDeltas[key] == slruImageEvery {
			a.materialize = append(a.materialize, key)
		}
	}
	return nil
}

// materializeSLRU stores the current value of the SLRU pages whose delta
// chains reached slruImageEvery as images at the last applied LSN.
// REQUIRES: the batch is applied (flush).
func (a *applier) materializeSLRU(ctx context.Context) error {
	var cs []timeline.Change
	for _, k := range a.materialize {
		d, err := a.in.TL.Get(ctx, k, timeline.LatestLSN)
		if err != nil {
			return fmt.Errorf("walingest: materializing SLRU page %s: %w", k, err)
		}
		cs = append(cs, timeline.Change{Key: k, LSN: a.end, Kind: layer.Image, Data: d})
		delete(a.slruDeltas, k)
	}
	a.materialize = a.materialize[:0]
	return a.in.TL.IngestBuffered(ctx, cs, a.end)
}

// slruExists reports whether an SLRU page has a version, remembering the
// answer: this Ingester is the only writer of SLRU pages.
func (a *applier) slruExists(ctx context.Context, key keyspace.Key) (bool, error) {
	if ok, known := a.slru[key]; known {
		return ok, nil
	}
	_, err := a.in.TL.Get(ctx, key, timeline.LatestLSN)
	switch {
	case err == nil:
		a.slru[key] = true
		return true, nil
	case errors.Is(err, timeline.ErrNotFound):
		return false, nil
	}
	return false, err
}

// onePage gives postgres.RedoSLRU one SLRU page to change; changes to
// other pages of the same record land in a scratch page (their own keys
// get the same delta).
type onePage struct {
	s       postgres.SLRU
	pageno  uint32
	page    []byte
	scratch []byte
}

func (o *onePage) Page(s postgres.SLRU, pageno uint32, zero bool) []byte {
	if s == o.s && pageno == o.pageno {
		if zero {
			clear(o.page)
		}
		return o.page
	}
	if o.scratch == nil {
		o.scratch = make([]byte, pg.BlockSize)
	}
	return o.scratch
}

// applySLRU materializes an SLRU page key from its base image and deltas.
func applySLRU(key keyspace.Key, base []byte, records [][]byte) ([]byte, error) {
	if base == nil {
		return nil, fmt.Errorf("%w: SLRU page %s without a base image", ErrBadDelta, key)
	}
	kind := binary.BigEndian.Uint32(key[1:5])
	segno := binary.BigEndian.Uint32(key[5:9])
	o := &onePage{s: postgres.SLRU(kind), pageno: segno*slruPagesPerSegment + key.Block(), page: make([]byte, pg.BlockSize)}
	copy(o.page, base)
	for _, d := range records {
		rr, err := DecodeDelta(d)
		if err != nil {
			return nil, err
		}
		r, err := wal.Decode(rr.LSN, rr.EndLSN, rr.Data)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadDelta, err)
		}
		if err := postgres.RedoSLRU(r, o); err != nil {
			return nil, err
		}
	}
	return o.page, nil
}
