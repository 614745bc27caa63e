package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
)

// TestInterruptedSlotRename: an agent killed while Postgres renamed a
// replication slot's folder (a create: <name>.tmp to <name>; a drop: the
// other way) leaves <name> empty beside a <name>.tmp holding the state
// file, since a folder rename here is a mkdir, file renames and a rmdir.
// Postgres then stopped at every start ("PANIC: could not open file
// pg_replslot/strata_sk3/state", seen in CI), and the compute never came
// back. Now the mount removes such a folder, and Postgres starts with the
// other slots as they were.
func TestInterruptedSlotRename(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	e := newEnv(t)
	be := NewMemory()
	fsys := e.mount(t, be, nil)
	cmd, err := pgtest.Command("initdb", "-D", e.mnt, "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8", "-A", "trust", "--no-sync")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	p := pgtest.StartOn(t, e.mnt, e.root, 0)
	p.Exec("SELECT pg_create_physical_replication_slot('kept', true)")
	p.Exec("SELECT pg_create_physical_replication_slot('torn', true)")
	p.Exec("CHECKPOINT")
	p.Crash()
	if err := fsys.Unmount(); err != nil {
		t.Fatal(err)
	}
	// What a rename of torn.tmp to torn that stopped after its mkdir
	// leaves (and a rename of torn to torn.tmp that stopped before its
	// rmdir): torn empty, the state in torn.tmp.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	w := fsys.WAL().Current()
	must(be.Mkdir(ctx, "pg_replslot/torn.tmp", 0o700, w))
	must(be.Rename(ctx, "pg_replslot/torn/state", "pg_replslot/torn.tmp/state", w))

	e.mount(t, be, nil)
	if _, err := os.Stat(filepath.Join(e.mnt, "pg_replslot", "torn")); !os.IsNotExist(err) {
		t.Fatalf("the slot folder without a state file is still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.mnt, "pg_replslot", "kept", "state")); err != nil {
		t.Fatalf("the intact slot: %v", err)
	}
	p2 := pgtest.StartOn(t, e.mnt, e.root, 0)
	if got := p2.Query("SELECT string_agg(slot_name, ',' ORDER BY slot_name) FROM pg_replication_slots"); got != "kept" {
		t.Fatalf("slots after the restart: %q, want kept", got)
	}
	// Postgres removed the leftover torn.tmp itself, as after a crash of
	// its own during the rename.
	if _, err := os.Stat(filepath.Join(e.mnt, "pg_replslot", "torn.tmp")); !os.IsNotExist(err) {
		t.Fatalf("torn.tmp after the start: %v", err)
	}
	p2.Exec("SELECT pg_create_physical_replication_slot('torn', true)")
	p2.Stop()
}
