package agent

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestPlaceWAL: each compute.pg_wal value puts pg_wal where it says, and a
// bad one is a config error.
func TestPlaceWAL(t *testing.T) {
	root := t.TempDir()
	old := TmpfsRoot
	TmpfsRoot = filepath.Join("/dev/shm", "strata-test-"+filepath.Base(root))
	t.Cleanup(func() { os.RemoveAll(TmpfsRoot); TmpfsRoot = old })
	c := Config{Scratch: filepath.Join(root, "scratch"), Mountpoint: filepath.Join(root, "pgdata")}
	disk := filepath.Join(c.Scratch, "pg_wal")
	for _, tc := range []struct {
		mode string
		dir  string
		link bool
	}{
		{PGWalFUSE, disk, false},
		{PGWalDisk, disk, true},
	} {
		c.PGWal = tc.mode
		p, err := c.placeWAL()
		if err != nil || p.dir != tc.dir || p.link != tc.link || p.own != "" {
			t.Fatalf("%s: %+v, %v", tc.mode, p, err)
		}
	}
	c.PGWal = "ramdisk"
	if _, err := c.placeWAL(); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad value: %v", err)
	}
	free, isTmpfs := tmpfsFree("/dev/shm")
	c.PGWal = PGWalAuto
	p, err := c.placeWAL()
	if err != nil {
		t.Fatal(err)
	}
	if want := isTmpfs && free >= TmpfsMinFree; (p.mode == PGWalTmpfs) != want {
		t.Fatalf("auto chose %s (/dev/shm tmpfs %v, %d bytes free)", p.mode, isTmpfs, free)
	}
	if !isTmpfs {
		t.Skip("/dev/shm is not a tmpfs")
	}
	c.PGWal = PGWalTmpfs
	p, err = c.placeWAL()
	if err != nil || !p.link || p.own != filepath.Join(TmpfsRoot, clusterTag(c.Mountpoint)) || p.dir != filepath.Join(p.own, "pg_wal") {
		t.Fatalf("tmpfs: %+v, %v", p, err)
	}

	// A folder of a compute whose data folder is gone is swept; one whose
	// data folder exists is kept.
	live := filepath.Join(root, "live", "pgdata")
	if err := os.MkdirAll(filepath.Dir(live), 0o755); err != nil {
		t.Fatal(err)
	}
	mk := func(name, mnt string) string {
		d := filepath.Join(TmpfsRoot, name)
		if err := os.MkdirAll(filepath.Join(d, "pg_wal"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, ownerFile), []byte(mnt+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		return d
	}
	stale := mk("strata-stale", filepath.Join(root, "deleted-cluster", "pgdata"))
	kept := mk("strata-live", live)
	if err := p.prepare(c.Mountpoint, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale folder kept: %v", err)
	}
	if _, err := os.Stat(kept); err != nil {
		t.Fatalf("live folder swept: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(p.own, ownerFile)); err != nil || string(b) != c.Mountpoint+"\n" {
		t.Fatalf("owner file: %q, %v", b, err)
	}
	if err := p.release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p.own); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("released folder still there: %v", err)
	}
}
