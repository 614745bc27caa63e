package walingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stratadb/strata/core/pageserver/keyspace"
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
