package pageserver_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

func query(t *testing.T, s *pgtest.Server, sql string) string {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var out string
	if err := c.QueryRow(ctx, sql).Scan(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

func exec1(t *testing.T, s *pgtest.Server, sql string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, s.ConnString("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		t.Fatal(err)
	}
}

// TestPostgresRoundTrip stores a real PostgreSQL 15 data directory in a
// pageserver (as writeback writes), uploads it, starts a second pageserver
// on an empty disk from the object store alone, takes a basebackup from it,
// and starts Postgres on that basebackup (plus the WAL, which the
// safekeepers would provide): the data must be all there and pg_amcheck
// must find nothing.
func TestPostgresRoundTrip(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	s := pgtest.Start(t, pgtest.Options{})
	for _, q := range []string{
		`CREATE TABLE acct (id int PRIMARY KEY, v text)`,
		`INSERT INTO acct SELECT g, md5(g::text) FROM generate_series(1, 20000) g`,
		`DELETE FROM acct WHERE id % 7 = 0`,
		`VACUUM acct`,
		`CREATE DATABASE other`,
		`CREATE EXTENSION amcheck`,
	} {
		exec1(t, s, q)
	}
	const check = `SELECT count(*)::text || ':' || sum(id)::text || ':' || md5(string_agg(v, ',' ORDER BY id)) FROM acct`
	want := query(t, s, check)
	s.Stop() // clean shutdown: a checkpoint, everything in the data files

	store := objectstore.NewMemory()
	cfg := pageserver.DefaultConfig()
	cfg.DataDir = t.TempDir()
	ps, err := pageserver.New(ctx, cfg, pageserver.Deps{Log: zerolog.Nop(), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	id := pg.TimelineID{0x9C}
	tl, err := ps.CreateTimeline(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := pageserver.ImportDataDir(ctx, tl, s.DataDir, 100); err != nil {
		t.Fatal(err)
	}
	if err := ps.AdvanceCommitLSN(id, 100); err != nil {
		t.Fatal(err)
	}
	if err := tl.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tl.Upload(ctx); err != nil {
		t.Fatal(err)
	}
	ps.Close()

	cfg.DataDir = t.TempDir()
	ps2, err := pageserver.New(ctx, cfg, pageserver.Deps{Log: zerolog.Nop(), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	defer ps2.Close()
	tl2, err := ps2.Timeline(id)
	if err != nil {
		t.Fatal(err)
	}
	var tarball bytes.Buffer
	if err := pageserver.Basebackup(ctx, tl2, timeline.LatestLSN, &tarball); err != nil {
		t.Fatal(err)
	}
	// Replace the data directory with the basebackup, keeping pg_wal.
	orig := s.DataDir + ".orig"
	if err := os.Rename(s.DataDir, orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(orig) })
	if err := untar(&tarball, s.DataDir); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", orig+"/pg_wal/.", s.DataDir+"/pg_wal/").CombinedOutput(); err != nil {
		t.Fatalf("copy pg_wal: %v %s", err, out)
	}
	if out, err := exec.Command("chown", "-R", pgtest.OSUser+":"+pgtest.OSUser, s.DataDir).CombinedOutput(); err != nil && os.Geteuid() == 0 {
		t.Fatalf("chown: %v %s", err, out)
	}
	// Every file but per-process ones comes back byte for byte.
	out, _ := exec.Command("diff", "-rq", orig, s.DataDir).CombinedOutput()
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line != "" && !strings.HasSuffix(line, "pg_internal.init") && !strings.HasSuffix(line, "postmaster.opts") {
			t.Errorf("data directory differs: %s", line)
		}
	}
	s.Launch()
	if got := query(t, s, check); got != want {
		t.Fatalf("after the round trip: %s, want %s", got, want)
	}
	if got := query(t, s, `SELECT count(*)::text FROM pg_database WHERE datname = 'other'`); got != "1" {
		t.Fatal("database 'other' lost")
	}
	cmd, err := pgtest.Command("pg_amcheck", "-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", "postgres", "-d", "postgres", "--heapallindexed")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pg_amcheck: %v\n%s", err, out)
	}
}

func untar(r io.Reader, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o700); err != nil {
				return err
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, tr); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
}
