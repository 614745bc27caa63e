package postgres

import (
	"errors"
	"strings"
	"testing"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

// Records the engine cannot redo are reported by name, never skipped.
func TestUnsupportedRecordsAreNamed(t *testing.T) {
	for _, c := range []struct {
		rm   wal.RmgrID
		info uint8
		name string
	}{
		{wal.RmGin, 0xA0, "Gin/UNKNOWN (a0)"},
		{wal.RmgrID(130), 0x00, "custom130/UNKNOWN (0)"}, // an extension's resource manager
		{wal.RmXLOG, 0x00, "XLOG/CHECKPOINT_SHUTDOWN"},
	} {
		r := &wal.Record{RmID: c.rm, Info: c.info, LSN: 0x1000, EndLSN: 0x1040,
			Blocks: []wal.BlockRef{{ID: 0, Page: pg.PageKey{Spc: 1663, DB: 5, Rel: 16384}}}}
		p := make([]byte, pg.BlockSize)
		page(p).init(0)
		err := RedoBlock(r, &r.Blocks[0], p, Options{})
		if !errors.Is(err, redo.ErrUnsupported) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: %v, want ErrUnsupported naming it", c.name, err)
		}
	}
}

// Malformed record data is an error, not a panic, and not ErrUnsupported.
func TestMalformedRecordIsAnError(t *testing.T) {
	r := &wal.Record{RmID: wal.RmHeap, Info: 0x00, LSN: 0x1000, EndLSN: 0x1040, MainData: []byte{200, 0, 0},
		Blocks: []wal.BlockRef{{ID: 0, Page: pg.PageKey{Rel: 1}, Data: []byte{1, 0, 0, 0, 24, 9, 9}}}}
	p := make([]byte, pg.BlockSize)
	page(p).init(0)
	err := RedoBlock(r, &r.Blocks[0], p, Options{})
	if err == nil || errors.Is(err, redo.ErrUnsupported) {
		t.Fatalf("insert at offset 200 of an empty page: %v", err)
	}
}

// With full_page_writes=off and wal_log_hints=on, Postgres logs
// FPI_FOR_HINT records without an image; redo leaves the page (and its
// LSN) as it is, as xlog_redo does. XLOG FPI without an image is an error.
func TestFPIForHintWithoutImage(t *testing.T) {
	key := pg.PageKey{Spc: 1663, DB: 5, Rel: 16384}
	p := make([]byte, pg.BlockSize)
	page(p).init(0)
	page(p).setLSN(0x900)
	want := append([]byte(nil), p...)
	r := &wal.Record{RmID: wal.RmXLOG, Info: 0xA0, LSN: 0x1000, EndLSN: 0x1040, Blocks: []wal.BlockRef{{ID: 0, Page: key}}}
	if err := RedoBlock(r, &r.Blocks[0], p, Options{HintBitsLogged: true}); err != nil {
		t.Fatal(err)
	}
	if string(p) != string(want) {
		t.Fatal("FPI_FOR_HINT without an image changed the page")
	}
	r.Info = 0xB0 // XLOG_FPI
	if err := RedoBlock(r, &r.Blocks[0], p, Options{}); err == nil {
		t.Fatal("XLOG FPI without an image accepted")
	}
}
