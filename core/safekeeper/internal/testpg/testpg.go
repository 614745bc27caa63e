// Package testpg starts a Postgres 15 primary set up the way strata's
// safekeepers expect (a password-authenticated replication user, synchronous
// replication to ANY 2 of three safekeepers, WAL kept for comparison) and
// compares safekeeper WAL with Postgres' own pg_wal, byte for byte. Tests only.
package testpg

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// ReplUser and ReplPassword are the replication role the safekeepers use.
const (
	ReplUser     = "strata_repl"
	ReplPassword = "s3cret-repl"
)

// Options shape the primary.
type Options struct {
	// Sync is synchronous_standby_names ("" for asynchronous replication).
	Sync string
	// Conf holds extra postgresql.conf settings.
	Conf map[string]string
}

// Start starts the primary and creates the replication role.
func Start(t testing.TB, o Options) *pgtest.Server {
	t.Helper()
	conf := map[string]string{
		"wal_keep_size":      "'4GB'", // keep pg_wal for byte comparisons
		"max_wal_size":       "'4GB'",
		"checkpoint_timeout": "'30min'",
		"wal_sender_timeout": "'10s'",
	}
	if o.Sync != "" {
		conf["synchronous_standby_names"] = "'" + o.Sync + "'"
	}
	for k, v := range o.Conf {
		conf[k] = v
	}
	srv := pgtest.Start(t, pgtest.Options{
		Conf:     conf,
		Password: "pg-superuser-pw",
		HBA: []string{
			"local all all trust",
			"host all postgres 127.0.0.1/32 trust",
			"host replication " + ReplUser + " 127.0.0.1/32 scram-sha-256",
		},
	})
	// No standby is connected yet: commit this one locally.
	srv.Exec("postgres", fmt.Sprintf("BEGIN; SET LOCAL synchronous_commit = local; CREATE ROLE %s WITH LOGIN REPLICATION PASSWORD '%s'; COMMIT", ReplUser, ReplPassword))
	return srv
}

// ReplConnString is the connection string a safekeeper uses.
func ReplConnString(srv *pgtest.Server) string {
	return fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=disable", ReplUser, ReplPassword, srv.Port)
}

// FlushLSN returns pg_current_wal_flush_lsn().
func FlushLSN(t testing.TB, srv *pgtest.Server) pg.LSN {
	t.Helper()
	l, err := pg.ParseLSN(srv.QueryString("postgres", "SELECT pg_current_wal_flush_lsn()::text"))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// WaitFor polls cond every 50 ms until it holds or the timeout passes.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CompareWAL checks that the bytes [from, to) in the segment files under
// walDir equal Postgres' pg_wal. It returns the number of bytes compared.
func CompareWAL(t testing.TB, srv *pgtest.Server, walDir string, from, to pg.LSN) int64 {
	t.Helper()
	return CompareWALDirs(t, walDir, filepath.Join(srv.DataDir, "pg_wal"), from, to)
}

// CompareWALDirs checks that two folders of WAL segment files hold the same
// bytes in [from, to) and returns how many it compared.
func CompareWALDirs(t testing.TB, mineDir, theirsDir string, from, to pg.LSN) int64 {
	t.Helper()
	const seg = pg.WALSegmentSize
	var n int64
	for p := from; p < to; {
		no := uint64(p) / seg
		end := min(to, pg.LSN((no+1)*seg))
		name := segName(no)
		mine := readRange(t, filepath.Join(mineDir, name), int64(uint64(p)%seg), int64(end-p))
		theirs := readRange(t, filepath.Join(theirsDir, name), int64(uint64(p)%seg), int64(end-p))
		if !bytes.Equal(mine, theirs) {
			i := 0
			for i < len(mine) && mine[i] == theirs[i] {
				i++
			}
			t.Fatalf("WAL in %s differs from %s/%s at LSN %s", mineDir, theirsDir, name, p+pg.LSN(i))
		}
		n += int64(len(mine))
		p = end
	}
	return n
}

// CompareBytes checks that data holds the pg_wal bytes starting at from.
func CompareBytes(t testing.TB, srv *pgtest.Server, from pg.LSN, data []byte, what string) {
	t.Helper()
	const seg = pg.WALSegmentSize
	for off := 0; off < len(data); {
		p := from + pg.LSN(off)
		no := uint64(p) / seg
		k := min(len(data)-off, int(uint64((no+1)*seg)-uint64(p)))
		theirs := readRange(t, filepath.Join(srv.DataDir, "pg_wal", segName(no)), int64(uint64(p)%seg), int64(k))
		if !bytes.Equal(data[off:off+k], theirs) {
			t.Fatalf("%s differs from pg_wal/%s", what, segName(no))
		}
		off += k
	}
}

func segName(no uint64) string {
	const perID = 0x100000000 / pg.WALSegmentSize
	return fmt.Sprintf("%08X%08X%08X", 1, uint32(no/perID), uint32(no%perID))
}

func readRange(t testing.TB, path string, off, n int64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatalf("read %s at %d: %v", path, off, err)
	}
	return b
}
