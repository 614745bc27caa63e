package postgres

import (
	"bytes"
	"errors"
	"strconv"
	"testing"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

type slruKey struct {
	s  SLRU
	pn uint32
}

type slruMap map[slruKey][]byte

func (m slruMap) Page(s SLRU, pn uint32, zero bool) []byte {
	k := slruKey{s, pn}
	if zero {
		m[k] = make([]byte, pg.BlockSize)
	}
	return m[k]
}

// loadSLRU splits SLRU segment files (32 pages each, named by segment
// number in hex) into pages.
func loadSLRU(t *testing.T, files map[SLRU]map[string][]byte) slruMap {
	out := slruMap{}
	for s, fs := range files {
		for name, b := range fs {
			seg, err := strconv.ParseUint(name, 16, 32)
			if err != nil {
				t.Fatalf("%s file %q", s, name)
			}
			for i := 0; (i+1)*pg.BlockSize <= len(b); i++ {
				out[slruKey{s, uint32(seg)*32 + uint32(i)}] = append([]byte(nil), b[i*pg.BlockSize:(i+1)*pg.BlockSize]...)
			}
		}
	}
	return out
}

// TestSLRUAgainstPostgres replays Transaction, CLOG and MultiXact records
// onto the pg_xact and pg_multixact pages copied at the start of the
// workload and compares them with Postgres' files after the final
// checkpoint.
func TestSLRUAgainstPostgres(t *testing.T) {
	w := sharedWAL(t)
	pages := loadSLRU(t, w.SLRUStart)
	src, err := wal.OpenDir(w.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	rd := wal.NewReader(src, w.Start)
	counts := map[string]int{}
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) || (err == nil && r.EndLSN > w.End) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if r.RmID != wal.RmXact && r.RmID != wal.RmCLOG && r.RmID != wal.RmMultiXact {
			continue
		}
		if err := RedoSLRU(r, pages); err != nil {
			t.Fatal(err)
		}
		counts[RecordName(r)]++
	}
	want := loadSLRU(t, w.SLRUEnd)
	perSLRU := map[SLRU]int{}
	for k, wp := range want {
		if !bytes.Equal(pages[k], wp) {
			t.Errorf("%s page %d differs: %s", k.s, k.pn, firstDiff(pages[k], wp))
		}
		perSLRU[k.s]++
	}
	t.Logf("records replayed: %v; pages equal to Postgres': %v", counts, perSLRU)
	for _, must := range []string{"Transaction/COMMIT", "Transaction/ABORT", "Transaction/COMMIT_PREPARED", "MultiXact/CREATE_ID"} {
		if counts[must] == 0 {
			t.Errorf("no %s record in the workload", must)
		}
	}
	if perSLRU[SLRUXact] == 0 || perSLRU[SLRUMultiXactOffsets] == 0 || perSLRU[SLRUMultiXactMembers] == 0 {
		t.Errorf("some SLRU not compared: %v", perSLRU)
	}
}
