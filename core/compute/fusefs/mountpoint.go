package fusefs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// fusectlDir is where the kernel's FUSE control filesystem lists the open
// FUSE connections, one folder per connection named by its device number.
var fusectlDir = "/sys/fs/fuse/connections"

// mountEntry is one line of /proc/self/mountinfo.
type mountEntry struct {
	dev    string // "major:minor"
	point  string
	fstype string
}

// mountAt returns the mount whose mount point is exactly dir (the last one,
// when several are stacked there).
func mountAt(dir string) (mountEntry, bool) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return mountEntry{}, false
	}
	abs := mountPath(dir)
	var found mountEntry
	ok := false
	for _, line := range strings.Split(string(b), "\n") {
		// id parent major:minor root point options [optional...] - fstype source super
		fields := strings.Fields(line)
		if len(fields) < 5 || unescapeMountinfo(fields[4]) != abs {
			continue
		}
		e := mountEntry{dev: fields[2], point: abs}
		for i := 5; i < len(fields)-1; i++ {
			if fields[i] == "-" {
				e.fstype = fields[i+1]
				break
			}
		}
		found, ok = e, true
	}
	return found, ok
}

// mountPath is dir as mountinfo names it: absolute, with the links of its
// parent folders resolved (a data folder under a linked /tmp or /work).
// dir itself is never looked at: a dead FUSE mount there would hang or fail
// the lookup.
func mountPath(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return dir
	}
	if parent, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		return filepath.Join(parent, filepath.Base(abs))
	}
	return abs
}

// unescapeMountinfo undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func mounted(dir string) bool {
	_, ok := mountAt(dir)
	return ok
}

// MountpointCleanup detaches whatever is mounted at dir, for a caller that
// owns dir and knows that the server of a mount found there is gone: a
// compute agent before it mounts, `strata down` after it stopped the
// agent, a supervisor whose agent died. It reads only /proc and
// /sys, never the mount itself, so that it cannot hang on a dead one.
//
// A FUSE mount's connection is aborted first (abortConnection). Without
// that, an agent killed while one of its own threads waited on its own
// mount never finishes dying: the kernel waits for the answer from the
// very process that is exiting, and the process keeps its ports and the
// mount. The mount is then detached lazily (MNT_DETACH, as umount -l).
func MountpointCleanup(dir string) error {
	e, ok := mountAt(dir)
	if !ok {
		return nil
	}
	var errs []error
	if isFUSE(e.fstype) {
		if err := abortConnection(e.dev); err != nil {
			errs = append(errs, err)
		}
	}
	if err := syscall.Unmount(e.point, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
		errs = append(errs, fmt.Errorf("fusefs: lazy unmount of %s: %w", e.point, err))
	}
	return errors.Join(errs...)
}

func isFUSE(fstype string) bool { return fstype == "fuse" || strings.HasPrefix(fstype, "fuse.") }

// abortConnection aborts the FUSE connection of device dev ("0:N") through
// the FUSE control filesystem, mounting it when it is not (systemd mounts
// it at boot; a container often has not): every pending and later request
// on it fails with ENOTCONN.
func abortConnection(dev string) error {
	_, minor, ok := strings.Cut(dev, ":")
	if !ok {
		return fmt.Errorf("fusefs: mountinfo device %q", dev)
	}
	if _, err := strconv.ParseUint(minor, 10, 32); err != nil {
		return fmt.Errorf("fusefs: mountinfo device %q", dev)
	}
	if e, ok := mountAt(fusectlDir); !ok || e.fstype != "fusectl" {
		if err := syscall.Mount("fusectl", fusectlDir, "fusectl", 0, ""); err != nil {
			return fmt.Errorf("fusefs: mount the FUSE control filesystem at %s to abort connection %s: %w", fusectlDir, minor, err)
		}
	}
	conn := filepath.Join(fusectlDir, minor)
	if err := os.WriteFile(filepath.Join(conn, "abort"), []byte("1"), 0); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil // the connection is gone already
		}
		return fmt.Errorf("fusefs: abort FUSE connection %s: %w", minor, err)
	}
	return nil
}

// waitGone waits up to d until the connection of dev is released.
func waitGone(dev string, d time.Duration) bool {
	_, minor, _ := strings.Cut(dev, ":")
	deadline := time.Now().Add(d)
	for {
		if _, err := os.Stat(filepath.Join(fusectlDir, minor)); errors.Is(err, os.ErrNotExist) {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
