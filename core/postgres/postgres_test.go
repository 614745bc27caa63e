package postgres

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/pgtest"
)

func newServer(t *testing.T) *Server {
	t.Helper()
	if _, err := os.Stat(filepath.Join(DefaultBinDir, "postgres")); err != nil {
		t.Skip("PostgreSQL 15 not installed")
	}
	root, err := os.MkdirTemp("", "strata-postgres-test-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(root, 0o755)
	s := &Server{DataDir: filepath.Join(root, "pgdata"), Port: pgtest.FreePort(t), Log: zerolog.Nop()}
	t.Cleanup(func() {
		s.Stop(context.Background())
		os.RemoveAll(root)
	})
	return s
}

func TestLifecycle(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s := newServer(t)
	if err := s.Start(ctx, "pw"); err == nil {
		t.Fatal("start before initdb must fail")
	}
	if err := s.InitDB(ctx, "s3cret"); err != nil {
		t.Fatal(err)
	}
	if err := s.Configure(map[string]string{"shared_buffers": "'32MB'", "full_page_writes": "off"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Start(ctx, "s3cret"); err != nil {
		t.Fatal(err)
	}
	c, err := pgx.Connect(ctx, s.URL("s3cret", "postgres"))
	if err != nil {
		t.Fatal(err)
	}
	var fpw string
	if err := c.QueryRow(ctx, "SHOW full_page_writes").Scan(&fpw); err != nil || fpw != "off" {
		t.Fatalf("full_page_writes = %q, %v", fpw, err)
	}
	c.Close(ctx)
	// The password is enforced over TCP.
	if c, err := pgx.Connect(ctx, s.URL("wrong", "postgres")); err == nil {
		c.Close(ctx)
		t.Fatal("wrong password accepted")
	}
	pid, _ := s.PID()
	if pid == 0 {
		t.Fatal("no pid while running")
	}
	if err := s.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if pid, _ := s.PID(); pid != 0 {
		t.Fatalf("pid %d after stop", pid)
	}
	if err := s.Start(ctx, "s3cret"); err != nil {
		t.Fatal(err)
	}
}

func TestUnreachableDataDir(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	root := t.TempDir() // 0700, owned by root
	s := &Server{DataDir: filepath.Join(root, "sub", "pgdata"), Port: 1, Log: zerolog.Nop()}
	err := s.InitDB(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), "not searchable") {
		t.Fatalf("err = %v", err)
	}
}
