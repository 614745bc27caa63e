package walingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stratadb/strata/core/pageserver/ingest"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

func TestDeltaRoundTrip(t *testing.T) {
	raw := make([]byte, wal.RecordHeaderSize+5)
	raw[7] = 9
	d := EncodeDelta(&wal.Record{LSN: 0x1000028, EndLSN: 0x1000050, Raw: raw})
	r, err := DecodeDelta(d)
	if err != nil {
		t.Fatal(err)
	}
	if r.LSN != 0x1000028 || r.EndLSN != 0x1000050 || len(r.Data) != len(raw) || r.Data[7] != 9 {
		t.Fatalf("decoded %+v", r)
	}
	if _, err := DecodeDelta(d[:20]); !errors.Is(err, ErrBadDelta) {
		t.Fatalf("short delta: %v", err)
	}
}

type fakeEngine struct{ got []redo.Request }

func (f *fakeEngine) Redo(_ context.Context, reqs []redo.Request) ([]redo.Result, error) {
	f.got = append(f.got, reqs...)
	return []redo.Result{{Page: []byte("page")}}, nil
}
func (f *fakeEngine) Close() error { return nil }

func TestRedoAdapter(t *testing.T) {
	e := &fakeEngine{}
	pk := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}.Page(3)
	raw := make([]byte, wal.RecordHeaderSize)
	d := EncodeDelta(&wal.Record{LSN: 100, EndLSN: 128, Raw: raw})
	out, err := Redo{Engine: e}.Apply(keyspace.RelBlock(pk), 128, []byte("base"), [][]byte{d, d})
	if err != nil || string(out) != "page" {
		t.Fatalf("Apply = %q, %v", out, err)
	}
	if len(e.got) != 1 || e.got[0].Key != pk || string(e.got[0].Base) != "base" || len(e.got[0].Records) != 2 || e.got[0].Records[1].EndLSN != 128 {
		t.Fatalf("engine got %+v", e.got)
	}
	if _, err := (Redo{Engine: e}).Apply(keyspace.RelBlock(pk), 128, nil, [][]byte{d}); err != nil {
		t.Fatal(err)
	}
	if b := e.got[1].Base; len(b) != pg.BlockSize || !bytes.Equal(b, make([]byte, pg.BlockSize)) {
		t.Fatalf("WillInit chain: base of %d bytes, want a zeroed page", len(b))
	}
	if _, err := (Redo{Engine: e}).Apply(keyspace.RelSize(pk.Tag()), 128, nil, [][]byte{d}); !errors.Is(err, ErrBadDelta) {
		t.Fatalf("non-block key: %v", err)
	}
	if _, err := (Redo{Engine: e}).Apply(keyspace.RelBlock(pk), 128, nil, [][]byte{{1, 2}}); !errors.Is(err, ErrBadDelta) {
		t.Fatalf("bad delta: %v", err)
	}
}

// TestLiveComplete checks when a record counts as entirely received,
// across a page boundary.
func TestLiveComplete(t *testing.T) {
	const base = pg.LSN(0x2000000) // segment start: long header
	buf := make([]byte, 2*wal.PageSize)
	binary.LittleEndian.PutUint16(buf[2:], xlpLongHeader)
	// A record at the end of the first page that continues on the second.
	pos := wal.PageSize - 16
	binary.LittleEndian.PutUint32(buf[pos:], 100) // 16 bytes here, 84 on page 2
	l := &liveWAL{base: base}
	if err := l.append(base, buf[:wal.PageSize]); err != nil {
		t.Fatal(err)
	}
	if l.complete(base + pg.LSN(pos)) {
		t.Fatal("complete with the second page missing")
	}
	if err := l.append(base+wal.PageSize, buf[wal.PageSize:wal.PageSize+shortHeaderSize+83]); err != nil {
		t.Fatal(err)
	}
	if l.complete(base + pg.LSN(pos)) {
		t.Fatal("complete one byte short")
	}
	if err := l.append(base+wal.PageSize+shortHeaderSize+83, buf[wal.PageSize+shortHeaderSize+83:]); err != nil {
		t.Fatal(err)
	}
	if !l.complete(base + pg.LSN(pos)) {
		t.Fatal("not complete with all bytes")
	}
	// At a segment start the long header is skipped; zeros after it are an
	// end-of-WAL marker the reader may look at.
	if !l.complete(base) {
		t.Fatal("zero length at a received position should be readable")
	}
	// An impossible length is left to the reader to report, not awaited.
	binary.LittleEndian.PutUint32(buf[pos:], 2<<30)
	bad := &liveWAL{base: base}
	if err := bad.append(base, buf[:wal.PageSize]); err != nil {
		t.Fatal(err)
	}
	if !bad.complete(base + pg.LSN(pos)) {
		t.Fatal("a corrupt record length would be waited for")
	}
	if err := l.append(base+1, buf[:10]); err == nil {
		t.Fatal("a chunk that does not continue the stream was accepted")
	}
	l.trim(base + wal.PageSize + 8)
	if l.base != base+wal.PageSize {
		t.Fatalf("trim kept base %s", l.base)
	}
	page := make([]byte, wal.PageSize)
	if err := l.ReadPage(base, page); !errors.Is(err, wal.ErrCorrupt) {
		t.Fatalf("trimmed page: %v", err)
	}
	if err := l.ReadPage(base+2*wal.PageSize, page); !errors.Is(err, wal.ErrEndOfWAL) {
		t.Fatalf("page not received: %v", err)
	}
}

// TestExtendZeroes checks that a block past a relation's end gets zeroed
// pages before it and starts from zeros itself, as Postgres' redo does.
func TestExtendZeroes(t *testing.T) {
	tl, _ := newTimeline(t)
	a := newApplier(&Ingester{TL: tl})
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.VMFork}
	rec := ingest.Record{LSN: 0x1000100, Blocks: []ingest.BlockChange{{Page: rel.Page(3), Kind: layer.Delta, Data: []byte("d")}}}
	ctx := context.Background()
	if err := a.extend(ctx, &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec.Blocks) != 4 {
		t.Fatalf("%d block changes, want 3 zero pages and the record's", len(rec.Blocks))
	}
	for i, b := range rec.Blocks[:3] {
		if b.Page != rel.Page(uint32(i)) || b.Kind != layer.Image || !bytes.Equal(b.Data, make([]byte, pg.BlockSize)) {
			t.Fatalf("change %d: %v kind %d, %d bytes", i, b.Page, b.Kind, len(b.Data))
		}
	}
	if b := rec.Blocks[3]; b.Page != rel.Page(3) || b.Kind != layer.WillInit {
		t.Fatalf("extending change: %v kind %d", b.Page, b.Kind)
	}
	// Inside the relation (as now extended) a delta stays a delta.
	rec2 := ingest.Record{LSN: 0x1000200, Blocks: []ingest.BlockChange{{Page: rel.Page(2), Kind: layer.Delta, Data: []byte("d")}}}
	if err := a.extend(ctx, &rec2); err != nil {
		t.Fatal(err)
	}
	if len(rec2.Blocks) != 1 || rec2.Blocks[0].Kind != layer.Delta {
		t.Fatalf("in-range change became %+v", rec2.Blocks)
	}
	// Once applied, sizes come from the timeline.
	if err := ingest.Apply(ctx, tl, []ingest.Record{rec}, rec.LSN); err != nil {
		t.Fatal(err)
	}
	clear(a.sizes)
	if n, err := a.size(ctx, rel); err != nil || n != 4 {
		t.Fatalf("size after apply = %d, %v", n, err)
	}
	if p, err := tl.GetPage(ctx, rel.Page(1), rec.LSN, rec.LSN); err != nil || !bytes.Equal(p, make([]byte, pg.BlockSize)) {
		t.Fatalf("gap page: %d bytes, %v", len(p), err)
	}
}

// TestCopyDatabaseZeroPages: CREATE DATABASE ... FILE_COPY copies a
// template's page of zeros (stored as a tombstone) as one, so a page of
// an earlier database with the new database's OID does not show through.
func TestCopyDatabaseZeroPages(t *testing.T) {
	ctx := context.Background()
	tl, _ := newTimeline(t)
	src := pg.RelTag{Spc: 1663, DB: 1, Rel: 1259}
	dst := pg.RelTag{Spc: 1663, DB: 16400, Rel: 1259}
	page := func(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }
	// An earlier database 16400 had two pages in its relation 1259.
	if _, err := tl.PutPages(ctx, []timeline.PageWrite{{Page: dst.Page(0), W: 100, Data: page(7)}, {Page: dst.Page(1), W: 100, Data: page(7)}}); err != nil {
		t.Fatal(err)
	}
	// The template: block 0 with content, block 1 a page of zeros.
	if _, err := tl.PutPages(ctx, []timeline.PageWrite{{Page: src.Page(0), W: 200, Data: page(1)}, {Page: src.Page(1), W: 200}}); err != nil {
		t.Fatal(err)
	}
	in := &Ingester{TL: tl}
	cs, err := in.copyDatabase(ctx, 300, postgres.FileOp{Kind: "create-database", DB: 16400, Spcs: []uint32{1663}, SrcDB: 1, SrcSpc: 1663})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tl.Put(ctx, cs); err != nil {
		t.Fatal(err)
	}
	for blk, want := range [][]byte{page(1), make([]byte, pg.BlockSize)} {
		got, err := tl.GetPage(ctx, dst.Page(uint32(blk)), timeline.LatestLSN, 0)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("copied block %d: %v, reads %d, want %d", blk, err, got[0], want[0])
		}
	}
}

// TestFSMTruncate checks the free space map's size after a heap
// truncation, as FreeSpaceMapPrepareTruncateRel computes it: FSM block 0 is
// the root, 1 the first middle page, 2 the first leaf (heap blocks
// 0..4068), 3 the second leaf, and so on.
func TestFSMTruncate(t *testing.T) {
	for _, c := range []struct {
		heap, fsm, want uint32
		ok              bool
	}{
		{heap: 0, fsm: 3, want: 2, ok: true},          // the first leaf goes whole
		{heap: 10, fsm: 3, want: 3, ok: true},         // the first leaf stays (tail cleared)
		{heap: 10, fsm: 2, ok: false},                 // the leaf does not exist
		{heap: 4069, fsm: 4, want: 3, ok: true},       // cut at the second leaf's first slot
		{heap: 4069, fsm: 3, ok: false},               // already that small
		{heap: 2*4069 + 5, fsm: 6, want: 5, ok: true}, // third leaf, block 4, kept
	} {
		got, ok := fsmBlocksAfterTruncate(c.heap, c.fsm)
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("heap %d, FSM %d blocks: %d %v, want %d %v", c.heap, c.fsm, got, ok, c.want, c.ok)
		}
	}
}

// TestXactDroppedRels decodes the relations of a commit record by hand.
func TestXactDroppedRels(t *testing.T) {
	main := make([]byte, 8)                                  // xact_time
	main = binary.LittleEndian.AppendUint32(main, 1<<1|1<<2) // subxacts, relfilenodes
	main = binary.LittleEndian.AppendUint32(main, 2)         // two subxacts
	main = binary.LittleEndian.AppendUint32(main, 901)
	main = binary.LittleEndian.AppendUint32(main, 902)
	main = binary.LittleEndian.AppendUint32(main, 1) // one relation
	for _, v := range []uint32{1663, 5, 16400} {
		main = binary.LittleEndian.AppendUint32(main, v)
	}
	r := &wal.Record{RmID: wal.RmXact, Info: 0x80, MainData: main} // COMMIT with xinfo
	rels, err := xactDroppedRels(r)
	if err != nil || len(rels) != 1 || rels[0] != (pg.RelTag{Spc: 1663, DB: 5, Rel: 16400}) {
		t.Fatalf("rels %v, %v", rels, err)
	}
	r.MainData = main[:len(main)-4]
	if _, err := xactDroppedRels(r); err == nil {
		t.Fatal("truncated record accepted")
	}
	r.Info = 0x10 // PREPARE: no drops
	if rels, err := xactDroppedRels(r); err != nil || rels != nil {
		t.Fatalf("prepare: %v, %v", rels, err)
	}
}
