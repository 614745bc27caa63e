package restore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/safekeeper/archive"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// TestWalkTo reads real PostgreSQL 15 WAL from an archive: it stops at the
// first record at or after the target, accepts a durable end that cuts a
// record (the end of WAL, no record after the target), and refuses a
// damaged record before the target, naming where the records end. The
// segments it read are written for pg_wal.
func TestWalkTo(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	srv := pgtest.Start(t, pgtest.Options{Conf: map[string]string{"wal_keep_size": "'1GB'"}})
	srv.Exec("postgres", "CREATE TABLE t (id int, v text)")
	srv.Exec("postgres", "INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g")
	srv.Exec("postgres", "SELECT pg_switch_wal()")
	srv.Stop()

	// The segments, and the records of the first one.
	walDir := filepath.Join(srv.DataDir, "pg_wal")
	src, err := wal.OpenDir(walDir)
	if err != nil {
		t.Fatal(err)
	}
	segs := src.Segments()
	first := pg.LSN(segs[0] * pg.WALSegmentSize)
	rd := wal.NewReader(src, first+40) // past the long page header
	var recs []*wal.Record
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			break
		}
		if err != nil {
			t.Fatalf("reading the test WAL (segments %v, %d records read): %v", segs, len(recs), err)
		}
		recs = append(recs, &wal.Record{LSN: r.LSN, EndLSN: r.EndLSN})
	}
	if len(recs) < 2000 {
		t.Fatalf("the test WAL has %d records (segments %v), want 2,000 or more", len(recs), segs)
	}
	sysID := rd.SystemID()
	src.Close()

	store := objectstore.NewMemory()
	ctx := context.Background()
	var segData [][]byte
	for _, no := range segs {
		name := wal.SegmentFileName(1, no, pg.WALSegmentSize)
		b, err := os.ReadFile(filepath.Join(walDir, name))
		if err != nil {
			t.Fatal(err)
		}
		segData = append(segData, b)
		if err := store.Put(ctx, archive.Key("wal", sysID, name, false), bytes.NewReader(b), objectstore.PutOptions{Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
	}
	from := recs[0].LSN
	end := recs[len(recs)-1].EndLSN // the durable end: all of it
	walk := func(st objectstore.Store, x, end pg.LSN) (walResult, string, error) {
		dir := t.TempDir()
		s := &segments{ctx: ctx, src: agent.WALSource{Archive: st, Prefix: "wal", SystemID: sysID, SegmentSize: pg.WALSegmentSize},
			tli: 1, end: end, dir: dir, uid: os.Getuid(), gid: os.Getgid()}
		res, err := walkTo(ctx, s, from, x)
		return res, dir, err
	}

	// A target in the middle: the record that starts there is read.
	x := recs[1000].LSN
	res, dir, err := walk(store, x, end)
	if err != nil || !res.next || res.consistent != recs[999].EndLSN {
		t.Fatalf("walk to %s: %+v, %v; want the next record read, consistent at %s", x, res, err, recs[999].EndLSN)
	}
	if _, err := os.Stat(filepath.Join(dir, wal.SegmentFileName(1, segs[0], pg.WALSegmentSize))); err != nil {
		t.Errorf("the segment read is not in pg_wal: %v", err)
	}
	// A target inside a record (past its start): that record counts as before.
	res, _, err = walk(store, recs[1000].LSN+8, end)
	if err != nil || !res.next || res.consistent != recs[1000].EndLSN {
		t.Fatalf("walk to inside record 1000: %+v, %v; want consistent at its end %s", res, err, recs[1000].EndLSN)
	}
	// The durable end cuts record 1500: the WAL ends there, nothing follows.
	cut := recs[1500].LSN + 10
	res, _, err = walk(store, cut, cut)
	if err != nil || res.next || res.consistent != recs[1499].EndLSN {
		t.Fatalf("walk to a durable end %s that cuts a record: %+v, %v; want the end of WAL after %s", cut, res, err, recs[1499].EndLSN)
	}
	// A target at the durable end: every record, none after.
	res, _, err = walk(store, end, end)
	if err != nil || res.next || res.consistent != end {
		t.Fatalf("walk to the durable end %s: %+v, %v", end, res, err)
	}
	// A durable end where pg_switch_wal's record ends, which takes the
	// rest of its segment (an archive of whole segments after a switch):
	// every record, none after.
	sw := -1
	for i, r := range recs {
		if uint64(r.EndLSN)%pg.WALSegmentSize == 0 {
			sw = i
		}
	}
	if sw < 0 {
		t.Fatal("the test WAL has no record that ends at a segment boundary (pg_switch_wal's)")
	}
	swEnd := recs[sw].EndLSN
	res, _, err = walk(store, swEnd, swEnd)
	if err != nil || res.next || res.consistent != swEnd {
		t.Fatalf("walk to the end of pg_switch_wal's segment %s: %+v, %v; want every record, none after", swEnd, res, err)
	}
	// A damaged record before the target (a flipped byte: its CRC), and
	// a hole (zeros, which read as the end of WAL) before the durable end.
	for _, damage := range []string{"flipped byte", "hole"} {
		bad := objectstore.NewMemory()
		for i, no := range segs {
			b := bytes.Clone(segData[i])
			if i == 0 {
				off := uint64(recs[700].LSN) - segs[0]*pg.WALSegmentSize
				if damage == "hole" {
					clear(b[off : off+64])
				} else {
					b[off+30] ^= 0xFF
				}
			}
			name := wal.SegmentFileName(1, no, pg.WALSegmentSize)
			if err := bad.Put(ctx, archive.Key("wal", sysID, name, false), bytes.NewReader(b), objectstore.PutOptions{Size: int64(len(b))}); err != nil {
				t.Fatal(err)
			}
		}
		_, _, err = walk(bad, x, end)
		if err == nil || !strings.Contains(err.Error(), "the records end at "+recs[699].EndLSN.String()) {
			t.Fatalf("walk over a %s: %v; want it refused where the records end, %s", damage, err, recs[699].EndLSN)
		}
	}
}
