package pgshm_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/internal/pgshm"
	"github.com/stratadb/strata/internal/pgtest"
)

// TestReleaseAfterKill9: a real Postgres 15 and its backends are killed
// with SIGKILL while a parallel query holds a dynamic shared memory segment;
// Release removes the postmaster's System V segment, its control segment
// and the query's segment, which stay without it.
func TestReleaseAfterKill9(t *testing.T) {
	s := pgtest.Start(t, pgtest.Options{Conf: map[string]string{"shared_buffers": "16MB"}})
	pid := s.PID()
	seg, err := pgshm.Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	if removed, busy, err := seg.Release(); err != nil || !busy || len(removed) != 0 {
		t.Fatalf("Release while the postmaster runs: removed %v, busy %v, %v; want nothing, busy", removed, busy, err)
	}
	before := dsmFiles(t)

	// A query run by a parallel worker: its segment lives until it ends.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, q := range []string{"SET force_parallel_mode = on", "SET parallel_setup_cost = 0", "SET max_parallel_workers_per_gather = 1"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _, _ = conn.Exec(ctx, "SELECT pg_sleep(60)") }()
	for deadline := time.Now().Add(20 * time.Second); s.QueryString("postgres",
		"SELECT count(*)::text FROM pg_stat_activity WHERE backend_type = 'parallel worker'") != "1"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no parallel worker started for the query")
		}
	}
	var added []string
	for f := range dsmFiles(t) {
		if !before[f] {
			added = append(added, f)
		}
	}
	// The backends first, with SIGKILL, as the compute agent kills those a
	// dead postmaster left: none of them detaches from the query's segment
	// (a backend that exits on its own removes what it was last to hold).
	// (Not s.Kill9, which releases the segment itself; see the end.)
	for _, c := range append(pgtest.Children(pid), pid) {
		if err := syscall.Kill(c, syscall.SIGKILL); err != nil && err != syscall.ESRCH {
			t.Fatal(err)
		}
	}

	var removed []string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		r, busy, err := seg.Release()
		if err != nil {
			t.Fatal(err)
		}
		if !busy {
			removed = r
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the killed postmaster's segment is still attached after 30 s")
		}
	}
	t.Logf("removed %v", removed)
	if w := "System V segment " + strconv.Itoa(seg.ShmID); !contains(removed, w) {
		t.Errorf("removed %v, not %s", removed, w)
	}
	// Other servers on the machine may have made some of the new files;
	// the query's is one of them.
	query := false
	for _, a := range added {
		query = query || contains(removed, a)
	}
	if !query {
		t.Errorf("removed %v: none of the files that appeared with the query (%v)", removed, added)
	}
	if len(removed) < 3 { // the segment, the control segment, the query's
		t.Errorf("removed %v: want the System V segment, the control segment and the query's segment", removed)
	}
	for _, r := range removed {
		if strings.HasPrefix(r, "/dev/shm/") {
			if _, err := os.Stat(r); !os.IsNotExist(err) {
				t.Errorf("%s is still there (%v)", r, err)
			}
		}
	}
	if ok, err := seg.Exists(); ok || err != nil {
		t.Errorf("System V segment %d is still there (%v)", seg.ShmID, err)
	}
	// A second Release finds nothing left.
	if removed, busy, err := seg.Release(); err != nil || busy || len(removed) != 0 {
		t.Errorf("second Release: removed %v, busy %v, %v", removed, busy, err)
	}
	// The data directory still starts (and Postgres finds nothing of the
	// old postmaster to clean up).
	s.Kill9() // reaps the dead postmaster
	s.Launch()
	if got := s.QueryString("postgres", "SELECT 1::text"); got != "1" {
		t.Fatalf("after the restart: %q", got)
	}
	// pgtest's own Kill9 releases what the postmaster it kills leaves.
	seg2, err := pgshm.Of(s.PID())
	if err != nil {
		t.Fatal(err)
	}
	s.Kill9()
	if removed, busy, err := seg2.Release(); err != nil || busy || len(removed) != 0 {
		t.Errorf("after pgtest's Kill9: removed %v, busy %v, %v; want nothing left", removed, busy, err)
	}
	if ok, err := seg2.Exists(); ok || err != nil {
		t.Errorf("after pgtest's Kill9: System V segment %d is still there (%v)", seg2.ShmID, err)
	}
}

func dsmFiles(t *testing.T) map[string]bool {
	t.Helper()
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]bool{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "PostgreSQL.") {
			m["/dev/shm/"+e.Name()] = true
		}
	}
	return m
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}
