package fusefs

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/pgtest"
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
	root    string // postgres-owned folder holding the mountpoint and scratch
	mnt     string
	scratch string
	uid     uint32
	gid     uint32
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
	f, err := Mount(context.Background(), e.mnt, Options{
		Backend: be, Cache: cache, WALScratch: e.scratch, UID: e.uid, GID: e.gid,
		Log: zerolog.Nop(),
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
