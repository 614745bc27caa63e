package cluster

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/stratadb/strata/core/config"
)

// DiskUse is the local disk one part of the cluster takes.
type DiskUse struct {
	Name  string // safekeepers, pageserver, compute, objects
	Path  string
	Bytes int64 // allocated, as du counts them
	Err   string
}

// DiskFree is the space left on one filesystem that holds cluster state.
type DiskFree struct {
	Path        string
	Free, Total uint64
}

// diskStatus fills s.Disk and s.Free: what each part keeps under data_dir
// (and the fs object store, when it is one), and the room left, so that an
// operator sees a disk filling up before a safekeeper or the pageserver
// reports it full.
func (c *Cluster) diskStatus(s *Status) {
	parts := []DiskUse{
		{Name: "safekeepers", Path: filepath.Join(c.dataDir, "safekeepers")},
		{Name: "pageserver", Path: filepath.Join(c.dataDir, "pageserver")},
		{Name: "compute", Path: filepath.Join(c.dataDir, "compute")},
	}
	if c.cfg.ObjectStore.Type == "fs" && c.cfg.ObjectStore.Mode != config.ModeExternal && c.cfg.ObjectStore.FS.Root != "" {
		parts = append(parts, DiskUse{Name: "objects", Path: c.cfg.ObjectStore.FS.Root})
	}
	pgdata := c.postgres().DataDir // a FUSE mount: never walked, never stat'ed
	for _, p := range parts {
		n, err := dirBytes(p.Path, pgdata)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			p.Err = err.Error()
		}
		p.Bytes = n
		s.Disk = append(s.Disk, p)
	}
	// The room left on each filesystem: data_dir's, and that of any part
	// mounted elsewhere (a pageserver on its own disk).
	seen := map[uint64]bool{}
	dirs := []string{c.dataDir}
	for _, p := range parts {
		dirs = append(dirs, p.Path)
	}
	for _, dir := range dirs {
		var st unix.Statfs_t
		var fi unix.Stat_t
		if unix.Stat(dir, &fi) != nil || seen[fi.Dev] || unix.Statfs(dir, &st) != nil {
			continue
		}
		seen[fi.Dev] = true
		s.Free = append(s.Free, DiskFree{Path: dir, Free: st.Bavail * uint64(st.Bsize), Total: st.Blocks * uint64(st.Bsize)})
	}
}

// dirBytes sums the space allocated to the files under root, like du -s,
// without crossing into another filesystem and without touching skip: the
// compute's PGDATA is a FUSE mount (its pages live in the pageserver; a
// stat there would wait for a hung agent), and pg_wal may be a link to
// tmpfs. A file that goes away during the walk, or that cannot be read
// (a dead FUSE mount), is not counted.
func dirBytes(root, skip string) (int64, error) {
	var rootDev uint64
	var total int64
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if path == skip {
			return filepath.SkipDir
		}
		if err != nil {
			if path != root {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			if path != root {
				return nil
			}
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if path == root {
			rootDev = st.Dev
		} else if st.Dev != rootDev {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		total += st.Blocks * 512
		return nil
	})
	return total, err
}

// fmtBytes writes n the way df -h does (1024-based, one decimal).
func fmtBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// DiskStatus is the disk part of Status alone: it needs no running
// process, so `strata status` shows it for a stopped cluster too.
func (c *Cluster) DiskStatus() *Status {
	s := &Status{}
	c.diskStatus(s)
	return s
}

// PrintDisk writes the disk lines of a status report, none when no part
// keeps anything yet.
func (s *Status) PrintDisk(w io.Writer) {
	var total int64
	for _, d := range s.Disk {
		total += d.Bytes
	}
	if total == 0 {
		return
	}
	s.printDisk(w)
}

// printDisk writes the disk lines of a status report.
func (s *Status) printDisk(w io.Writer) {
	if len(s.Disk) == 0 {
		return
	}
	fmt.Fprint(w, "disk    ")
	for _, d := range s.Disk {
		if d.Err != "" {
			fmt.Fprintf(w, "  %s ? (%s)", d.Name, d.Err)
			continue
		}
		fmt.Fprintf(w, "  %s %s", d.Name, fmtBytes(uint64(d.Bytes)))
	}
	fmt.Fprintln(w)
	for _, f := range s.Free {
		fmt.Fprintf(w, "free      %s of %s on the filesystem of %s\n", fmtBytes(f.Free), fmtBytes(f.Total), f.Path)
	}
}
