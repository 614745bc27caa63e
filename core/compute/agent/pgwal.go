package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Where pg_wal lives (Config.PGWal, the config key compute.pg_wal). pg_wal
// is scratch in every case: the safekeepers make WAL durable and every start
// refills it from them.
const (
	// PGWalAuto is PGWalTmpfs when /dev/shm is a tmpfs with TmpfsMinFree
	// bytes free, else PGWalDisk.
	PGWalAuto = "auto"
	// PGWalTmpfs: pg_wal is a symbolic link out of the mount to a folder
	// under TmpfsRoot. WAL writes, Postgres' WAL fsyncs and the walsenders'
	// reads cost neither a FUSE round trip nor a disk flush.
	PGWalTmpfs = "tmpfs"
	// PGWalDisk: the same link, to the scratch folder on disk.
	PGWalDisk = "disk"
	// PGWalFUSE: pg_wal is a folder of the mount that passes through to the
	// scratch folder; every WAL write, fsync and walsender read crosses
	// FUSE.
	PGWalFUSE = "fuse"
)

// TmpfsRoot holds the tmpfs pg_wal folders, one per mountpoint.
var TmpfsRoot = "/dev/shm/strata"

// TmpfsMinFree is the free space PGWalAuto wants on /dev/shm: Postgres'
// default max_wal_size (1 GB) and room to spare.
const TmpfsMinFree = 2 << 30

// walPlace is where pg_wal lives for one agent.
type walPlace struct {
	mode string // PGWalTmpfs, PGWalDisk or PGWalFUSE
	dir  string // the folder holding the WAL files
	link bool   // pg_wal is a symbolic link to dir
	own  string // a folder of our own to remove at a clean stop ("": none)
}

// placeWAL resolves Config.PGWal.
func (c *Config) placeWAL() (walPlace, error) {
	disk := filepath.Join(c.Scratch, "pg_wal")
	mode := c.PGWal
	if mode == "" {
		mode = PGWalAuto
	}
	if mode == PGWalAuto {
		mode = PGWalDisk
		if free, ok := tmpfsFree(filepath.Dir(TmpfsRoot)); ok && free >= TmpfsMinFree {
			mode = PGWalTmpfs
		}
	}
	switch mode {
	case PGWalFUSE:
		return walPlace{mode: mode, dir: disk}, nil
	case PGWalDisk:
		return walPlace{mode: mode, dir: disk, link: true}, nil
	case PGWalTmpfs:
		if _, ok := tmpfsFree(filepath.Dir(TmpfsRoot)); !ok {
			return walPlace{}, fmt.Errorf("%w: compute.pg_wal: tmpfs, but %s is not a tmpfs (use disk)", ErrConfig, filepath.Dir(TmpfsRoot))
		}
		own := filepath.Join(TmpfsRoot, clusterTag(c.Mountpoint))
		return walPlace{mode: mode, dir: filepath.Join(own, "pg_wal"), link: true, own: own}, nil
	}
	return walPlace{}, fmt.Errorf("%w: compute.pg_wal: %q: want auto, tmpfs, disk or fuse", ErrConfig, c.PGWal)
}

// tmpfsFree returns the bytes free on dir and whether it is a tmpfs.
func tmpfsFree(dir string) (int64, bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return 0, false
	}
	return int64(st.Bavail) * st.Bsize, true
}

// ownerFile names, in a tmpfs pg_wal folder of ours, the mountpoint it
// belongs to.
const ownerFile = "mountpoint"

// prepare makes the folder that holds dir (tmpfs: its own folder, marked
// with the mountpoint) and removes tmpfs folders whose compute is gone for
// good (its mountpoint's parent folder no longer exists): they hold memory.
func (p walPlace) prepare(mountpoint string, uid, gid int) error {
	if p.own == "" {
		return nil
	}
	if err := os.MkdirAll(TmpfsRoot, 0o755); err != nil {
		return err
	}
	sweepTmpfs(mountpoint)
	if err := os.MkdirAll(p.own, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(p.own, ownerFile), []byte(mountpoint+"\n"), 0o644); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return os.Chown(p.own, uid, gid)
}

// sweepTmpfs removes the tmpfs pg_wal folders of computes whose data
// folder was removed (a deleted cluster, a finished test).
func sweepTmpfs(except string) {
	ents, err := os.ReadDir(TmpfsRoot)
	if err != nil {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(TmpfsRoot, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or being made
		}
		mnt := strings.TrimSpace(string(b))
		if mnt == except || mnt == "" {
			continue
		}
		if _, err := os.Stat(filepath.Dir(mnt)); errors.Is(err, os.ErrNotExist) {
			_ = os.RemoveAll(dir)
		}
	}
}

// release removes the tmpfs folder at a clean stop: its WAL is durable on
// the safekeepers, and the next start refills pg_wal.
func (p walPlace) release() error {
	if p.own == "" {
		return nil
	}
	return os.RemoveAll(p.own)
}
