package fusefs

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// needFUSE skips unless the test can mount (root and /dev/fuse).
func needFUSE(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("fusefs: mounting needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("fusefs: %v", err)
	}
}

type mountEnv struct {
	root      string // postgres-owned folder holding the mountpoint and scratch
	mnt       string
	scratch   string
	walLink   bool             // pg_wal a link to scratch (Options.WALLink)
	readAhead int              // Options.ReadAhead
	onDB      func(oid uint32) // Options.OnDatabaseDir
	uid       uint32
	gid       uint32
}

func newEnv(t testing.TB) *mountEnv {
	t.Helper()
	needFUSE(t)
	root := pgtest.MkdirOwned(t, "strata-fusefs-")
	e := &mountEnv{root: root, mnt: filepath.Join(root, "data"), scratch: filepath.Join(root, "walscratch")}
	if err := os.Mkdir(e.mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Chown(e.mnt); err != nil {
		t.Fatal(err)
	}
	cred, err := pgtest.Credential()
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		e.uid, e.gid = cred.Uid, cred.Gid
	}
	return e
}

// mount mounts a filesystem over be; the test's cleanup unmounts it (lazily
// if need be) even when the test fails.
func (e *mountEnv) mount(t testing.TB, be Backend, cache Cache) *FS {
	t.Helper()
	return e.mountAt(t, be, cache, 0)
}

// mountAt mounts with W starting at walStart (a compute started from storage).
func (e *mountEnv) mountAt(t testing.TB, be Backend, cache Cache, walStart pg.LSN) *FS {
	t.Helper()
	f, err := Mount(context.Background(), e.mnt, Options{
		Backend: be, Cache: cache, WALScratch: e.scratch, UID: e.uid, GID: e.gid,
		WALStart: walStart, WALLink: e.walLink, ReadAhead: e.readAhead, OnDatabaseDir: e.onDB, Log: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if mounted(e.mnt) {
			if err := f.Unmount(); err != nil {
				t.Errorf("unmount: %v", err)
			}
		}
		MountpointCleanup(e.mnt)
	})
	return f
}

// lsnChecker wraps a Backend and checks, for every page written, that its
// tag is at or above the page's own LSN (pd_lsn). W alone is not: Postgres'
// bulk writes (index builds, storage copies) reach smgr before their WAL is
// flushed, so the filesystem raises such tags to the page LSN.
type lsnChecker struct {
	Backend
	mu         sync.Mutex
	writes     int
	stamped    int
	controls   int
	violations []string
}

func (c *lsnChecker) WritePage(ctx context.Context, key pg.PageKey, page []byte, w pg.LSN) error {
	lsn := PageLSN(page)
	c.mu.Lock()
	c.writes++
	if lsn != 0 {
		c.stamped++
	}
	if lsn > w && len(c.violations) < 10 {
		c.violations = append(c.violations, fmt.Sprintf("%s: page LSN %v > W %v", key, lsn, w))
	}
	c.mu.Unlock()
	return c.Backend.WritePage(ctx, key, page, w)
}

// WriteFile checks that a pg_control write is tagged at or above the
// checkpoint it names (ControlFileData.checkPoint, bytes 32..40): the
// checkpointer flushes the checkpoint record before it updates pg_control.
func (c *lsnChecker) WriteFile(ctx context.Context, path string, off int64, data []byte, w pg.LSN) error {
	if path == "global/pg_control" && off == 0 && len(data) >= 40 {
		ckpt := pg.LSN(binary.LittleEndian.Uint64(data[32:40]))
		c.mu.Lock()
		c.controls++
		if ckpt > w && len(c.violations) < 10 {
			c.violations = append(c.violations, fmt.Sprintf("pg_control: checkpoint %v > W %v", ckpt, w))
		}
		c.mu.Unlock()
	}
	return c.Backend.WriteFile(ctx, path, off, data, w)
}

func (c *lsnChecker) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Logf("tag check: %d page writes, %d with a page LSN, %d pg_control writes; %d violations", c.writes, c.stamped, c.controls, len(c.violations))
	if len(c.violations) > 0 {
		t.Fatalf("page written with a tag below its own LSN:\n%s", strings.Join(c.violations, "\n"))
	}
	if c.stamped == 0 || c.controls == 0 {
		t.Fatal("no page with an LSN or no pg_control was written: the check checked nothing")
	}
}
