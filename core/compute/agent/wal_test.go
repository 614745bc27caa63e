package agent

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/core/safekeeper/archive"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/objectstore"
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

// TestCheckWALAtSwitch: a durable end where pg_switch_wal's segment ends
// (the WAL Postgres flushed after a switch and nothing since) is the end
// of one chain of valid records, though the last pages before it are the
// switch's padding; a hole before it is still found.
func TestCheckWALAtSwitch(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	srv := pgtest.Start(t, pgtest.Options{Conf: map[string]string{"wal_keep_size": "'1GB'"}})
	srv.Exec("postgres", "CHECKPOINT")
	from, err := pg.ParseLSN(srv.QueryString("postgres", "SELECT redo_lsn::text FROM pg_control_checkpoint()"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Exec("postgres", "CREATE TABLE t AS SELECT g, md5(g::text) FROM generate_series(1, 5000) g")
	sw, err := pg.ParseLSN(srv.QueryString("postgres", "SELECT pg_switch_wal()::text"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	seg := uint64(pg.WALSegmentSize)
	end := pg.LSN((uint64(sw) + seg - 1) / seg * seg)
	if uint64(from)/seg != uint64(end)/seg-1 {
		t.Fatalf("the test WAL runs from %s to the switch's segment end %s: want one segment", from, end)
	}
	name := walpos.FormatSegmentName(1, uint64(from)/seg, seg)
	data, err := os.ReadFile(filepath.Join(srv.DataDir, "pg_wal", name))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	write := func(b []byte) string {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	if err := checkWAL(ctx, write(data), from, end, seg); err != nil {
		t.Fatalf("WAL up to the end of pg_switch_wal's segment %s (the switch at %s): %v", end, sw, err)
	}
	hole := bytes.Clone(data)
	mid := (uint64(from)%seg + uint64(sw)%seg) / 2 &^ 7
	clear(hole[mid : mid+4096])
	if err := checkWAL(ctx, write(hole), from, end, seg); err == nil {
		t.Fatal("a zeroed hole before the switch was not found")
	}
}

// TestRecoverPastCleanShutdown: a stored pg_control older than the WAL,
// from a clean shutdown, makes Postgres start without replaying the WAL
// after its checkpoint (a commit there is lost). RecordsAfter finds that
// WAL, and ForceCrashRecovery's pg_control (state and CRC rewritten)
// makes a real Postgres 15 replay it: the row committed after the old
// checkpoint is there.
func TestRecoverPastCleanShutdown(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	srv := pgtest.Start(t, pgtest.Options{})
	srv.Exec("postgres", "CREATE TABLE t (id int)")
	srv.Stop()
	control := filepath.Join(srv.DataDir, ControlFile)
	old, err := os.ReadFile(control)
	if err != nil {
		t.Fatal(err)
	}
	ctl, err := ParseControl(old)
	if err != nil {
		t.Fatal(err)
	}
	if ctl.State != dbShutdowned {
		t.Fatalf("state %d after a clean stop", ctl.State)
	}
	walDir := filepath.Join(srv.DataDir, "pg_wal")
	end := pg.LSN(1 << 62)
	if after, err := RecordsAfter(walDir, ctl.Checkpoint, end); err != nil || after {
		t.Fatalf("records after the last clean shutdown checkpoint: %v, %v", after, err)
	}
	srv.Launch()
	srv.Exec("postgres", "INSERT INTO t VALUES (42)")
	srv.Stop()
	if after, err := RecordsAfter(walDir, ctl.Checkpoint, end); err != nil || !after {
		t.Fatalf("records after the older checkpoint: %v, %v", after, err)
	}
	if after, err := RecordsAfter(walDir, ctl.Checkpoint, ctl.Checkpoint+1); err != nil || after {
		t.Fatalf("records after the older checkpoint below an end just past it: %v, %v", after, err)
	}
	// The older pg_control, as a pageserver that lost the newer one
	// serves it, with crash recovery forced.
	b, err := ForceCrashRecovery(old)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := ParseControl(b); c.State != dbInProduction || c.Checkpoint != ctl.Checkpoint {
		t.Fatalf("rewritten pg_control: %+v", c)
	}
	if err := os.WriteFile(control, b, 0o600); err != nil {
		t.Fatal(err)
	}
	srv.Launch()
	if got := srv.QueryString("postgres", "SELECT count(*)::text FROM t WHERE id = 42"); got != "1" {
		t.Fatalf("the row committed after the older checkpoint: %s rows\n%s", got, srv.LogTail())
	}
	if !strings.Contains(srv.LogTail(), "redo") {
		t.Fatalf("no crash recovery in the server log:\n%s", srv.LogTail())
	}
	// A flipped byte is refused, not rewritten with a fresh CRC.
	bad := append([]byte(nil), old...)
	bad[100] ^= 1
	if _, err := ForceCrashRecovery(bad); err == nil {
		t.Fatal("a pg_control with a wrong CRC was rewritten")
	}
}

// TestFetchSegmentFromSharedArchive: with the safekeepers gone past a
// segment, the agent reads it from the archive under its own cluster's
// system identifier, also when the store holds another cluster's WAL (one
// bucket for two, or a cluster made again over the old one's objects).
// Before, the agent passed no identifier, the archive's were ambiguous,
// and the start failed with "not found" (seen on a strata up whose objects
// folder had held two earlier clusters).
func TestFetchSegmentFromSharedArchive(t *testing.T) {
	ctx := context.Background()
	st := objectstore.NewMemory()
	const seg = pg.WALSegmentSize
	name := "000000010000000000000003"
	for sys, fill := range map[uint64]byte{7001: 'a', 7002: 'b'} {
		body := bytes.Repeat([]byte{fill}, seg)
		if err := st.Put(ctx, archive.Key("wal", sys, name, false), bytes.NewReader(body), objectstore.PutOptions{Size: seg}); err != nil {
			t.Fatal(err)
		}
	}
	start, end := pg.LSN(3*seg), pg.LSN(3*seg+100)
	got, err := fetchSegment(ctx, WALSource{Archive: st, Prefix: "wal", SystemID: 7002}, name, start, end, seg)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != seg || got[0] != 'b' || got[99] != 'b' || got[100] != 0 {
		t.Fatalf("fetched %d bytes starting %q, byte 100 %q: want cluster 7002's segment cut at its end", len(got), got[:1], got[100:101])
	}
	if _, err := fetchSegment(ctx, WALSource{Archive: st, Prefix: "wal"}, name, start, end, seg); !errors.Is(err, safekeeper.ErrAmbiguousArchive) {
		t.Fatalf("without a system identifier: %v, want ErrAmbiguousArchive", err)
	}
}
