package fs

import (
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// tmpArea is one Store's private directory of temporary files under
// Root/%tmp. Several Stores (in several processes) may share a root: each
// holds an flock(2) on "<name>.lock" next to its directory "<name>" for as
// long as it is open. A lock that can be taken belongs to a process that
// died (the kernel drops flocks with the process), so its directory is
// stale and removed.
type tmpArea struct {
	dir  string
	lock *os.File
}

// openTmpArea removes stale areas under base and creates a new one. It
// returns how many stale areas it removed.
func openTmpArea(base string) (*tmpArea, int, error) {
	if err := os.MkdirAll(base, 0o700); err != nil {
		return nil, 0, fmt.Errorf("fs: creating %s: %w", base, err)
	}
	stale, err := cleanStale(base)
	if err != nil {
		return nil, stale, err
	}
	for attempt := 0; attempt < 10; attempt++ {
		lf, err := os.CreateTemp(base, "*.lock")
		if err != nil {
			return nil, stale, fmt.Errorf("fs: creating a lock file in %s: %w", base, err)
		}
		if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			lf.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				// Another Store's cleanStale took the lock of our new file
				// between our create and our flock (it looked stale) and
				// is removing it: start again. Three safekeepers sharing
				// an archive root and started together met this.
				continue
			}
			return nil, stale, fmt.Errorf("fs: locking %s: %w", lf.Name(), err)
		}
		// Another Store's cleanStale may also have taken the lock, removed
		// the file and let go before our flock: then start again too.
		a, err1 := lf.Stat()
		b, err2 := os.Stat(lf.Name())
		if err1 != nil || err2 != nil || !os.SameFile(a, b) {
			lf.Close()
			continue
		}
		dir := strings.TrimSuffix(lf.Name(), ".lock")
		if err := os.Mkdir(dir, 0o700); err != nil {
			lf.Close()
			os.Remove(lf.Name())
			return nil, stale, fmt.Errorf("fs: creating %s: %w", dir, err)
		}
		return &tmpArea{dir: dir, lock: lf}, stale, nil
	}
	return nil, stale, fmt.Errorf("fs: could not create a temporary area in %s", base)
}

// cleanStale removes the areas under base whose lock is free, and
// directories without a lock file (an area is created after its lock).
func cleanStale(base string) (int, error) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return 0, fmt.Errorf("fs: reading %s: %w", base, err)
	}
	return cleanListed(base, entries)
}

// cleanListed is cleanStale on a listing of base, which may be out of date.
func cleanListed(base string, entries []iofs.DirEntry) (int, error) {
	locks := map[string]bool{}
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".lock"); ok && !e.IsDir() {
			locks[name] = true
		}
	}
	removed := 0
	for _, e := range entries {
		path := filepath.Join(base, e.Name())
		if name, ok := strings.CutSuffix(e.Name(), ".lock"); ok && !e.IsDir() {
			lf, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				continue // removed by someone else meanwhile
			}
			if syscall.Flock(int(lf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
				// Its owner is gone.
				if err := os.RemoveAll(filepath.Join(base, name)); err != nil {
					lf.Close()
					return removed, fmt.Errorf("fs: removing stale temporary files: %w", err)
				}
				os.Remove(path)
				removed++
			}
			lf.Close()
			continue
		}
		if e.IsDir() && !locks[e.Name()] {
			// A listing taken while other Stores create and remove their
			// areas may hold a new area's directory and miss its lock file
			// (readdir under concurrent changes; seen in CI): look again.
			// An area's lock is created before its directory and removed
			// after it, so a lock absent now means the area is gone.
			if _, err := os.Lstat(path + ".lock"); err == nil {
				continue
			}
			if err := os.RemoveAll(path); err != nil {
				return removed, fmt.Errorf("fs: removing stale temporary files: %w", err)
			}
			removed++
		}
	}
	return removed, nil
}

// create opens a new temporary file in the area.
func (t *tmpArea) create() (*os.File, error) {
	f, err := os.CreateTemp(t.dir, "put-*")
	if errors.Is(err, iofs.ErrNotExist) {
		return nil, fmt.Errorf("temporary area %s is gone (store closed?): %w", t.dir, err)
	}
	return f, err
}

// close removes the area and releases its lock.
func (t *tmpArea) close() error {
	err := os.RemoveAll(t.dir)
	if rerr := os.Remove(t.lock.Name()); err == nil && !errors.Is(rerr, iofs.ErrNotExist) {
		err = rerr
	}
	if cerr := t.lock.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fs: removing temporary area: %w", err)
	}
	return nil
}
