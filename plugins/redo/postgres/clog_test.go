package postgres

import (
	"bytes"
	"errors"
	"strconv"
	"testing"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// TestCLOGAgainstPostgres replays Transaction and CLOG records onto the
// pg_xact pages copied at the start of the workload and compares them with
// Postgres' pg_xact after the final checkpoint.
func TestCLOGAgainstPostgres(t *testing.T) {
	w := sharedWAL(t)
	// pg_xact segment files hold 32 pages each and are named by segment
	// number in hex.
	load := func(files map[string][]byte) map[uint32][]byte {
		out := map[uint32][]byte{}
		for name, b := range files {
			seg, err := strconv.ParseUint(name, 16, 32)
			if err != nil {
				t.Fatalf("pg_xact file %q", name)
			}
			for i := 0; i*pg.BlockSize < len(b); i++ {
				out[uint32(seg)*32+uint32(i)] = append([]byte(nil), b[i*pg.BlockSize:(i+1)*pg.BlockSize]...)
			}
		}
		return out
	}
	pages := load(w.XactStart)
	src, err := wal.OpenDir(w.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	rd := wal.NewReader(src, w.Start)
	commits, aborts, zeroed := 0, 0, 0
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) || (err == nil && r.EndLSN > w.End) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if pn, ok := CLOGZeroPage(r); ok {
			pages[pn] = make([]byte, pg.BlockSize)
			zeroed++
			continue
		}
		ch, ok, err := XactStatusChange(r)
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		if ch.Status == XactCommitted {
			commits++
		} else {
			aborts++
		}
		for _, x := range ch.XIDs {
			pn := CLOGPageOf(x)
			p, ok := pages[pn]
			if !ok {
				t.Fatalf("xid %d on pg_xact page %d that was never zeroed", x, pn)
			}
			SetXactStatus(ch, pn, p)
		}
	}
	want := load(w.XactEnd)
	if len(want) == 0 || commits == 0 {
		t.Fatalf("nothing to compare (%d pages, %d commits)", len(want), commits)
	}
	for pn, wp := range want {
		if !bytes.Equal(pages[pn], wp) {
			t.Errorf("pg_xact page %d differs: %s", pn, firstDiff(pages[pn], wp))
		}
	}
	t.Logf("%d commits, %d aborts, %d zeroed pages replayed; %d pg_xact pages equal Postgres'", commits, aborts, zeroed, len(want))
}
