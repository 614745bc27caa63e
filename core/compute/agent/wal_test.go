package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// TestCheckWAL: initdb's WAL is one chain of valid records up to its end;
// a zeroed hole or a flipped byte in the middle (what a recovery would
// silently stop at, losing every commit after it) is found and named.
func TestCheckWAL(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	data := filepath.Join(pgtest.MkdirOwned(t, "checkwal-*"), "data")
	cmd, err := pgtest.Command("initdb", "-D", data, "--no-sync", "-A", "trust", "-U", "postgres")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	const name = "000000010000000000000001"
	seg, err := os.ReadFile(filepath.Join(data, "pg_wal", name))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	from := pg.LSN(pg.WALSegmentSize) // the segment's first record
	// The last record ends at or just past the last non-zero byte.
	last := len(seg)
	for last > 0 && seg[last-1] == 0 {
		last--
	}
	end := from + pg.LSN((last+7)&^7)
	write := func(b []byte) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	if err := checkWAL(ctx, write(seg), from, end, pg.WALSegmentSize); err != nil {
		t.Fatalf("initdb's WAL: %v", err)
	}
	mid := (last / 2) &^ 7
	hole := append([]byte(nil), seg...)
	clear(hole[mid : mid+4096])
	err = checkWAL(ctx, write(hole), from, end, pg.WALSegmentSize)
	if err == nil {
		t.Fatal("a zeroed hole in the middle of the WAL was not found")
	}
	t.Logf("hole: %v", err)
	flipped := append([]byte(nil), seg...)
	flipped[mid+100] ^= 0x40
	if err := checkWAL(ctx, write(flipped), from, end, pg.WALSegmentSize); err == nil || !strings.Contains(err.Error(), "the records end at") {
		t.Fatalf("a flipped byte: %v", err)
	}
	// A cut end (a safekeeper's flush inside a record) is not a hole: the
	// chain must reach the last record end below the cut.
	cut := from + pg.LSN(last-3)
	if err := checkWAL(ctx, write(seg), from, cut, pg.WALSegmentSize); err != nil {
		t.Fatalf("WAL cut inside its last record: %v", err)
	}
}
