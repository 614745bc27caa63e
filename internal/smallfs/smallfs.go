// Package smallfs mounts a small tmpfs for tests that need a full disk: a
// real filesystem that answers ENOSPC when its size is used up, and that
// can be grown while mounted (an operator freeing space). Tests only; it
// needs root (mount(2)) and skips the test otherwise.
package smallfs

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// Mount mounts a tmpfs of size bytes on a new folder under t.TempDir() and
// returns the folder. The mount is removed when the test ends, whatever its
// outcome (lazily, so that a file a failed test left open cannot keep it).
func Mount(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	MountAt(t, dir, size, "0700")
	return dir
}

// MountAt mounts a tmpfs of size bytes on dir (created when missing) with
// the given mode, removed when the test ends like Mount's. Cleanups run
// last registered first: stop whatever writes into dir in a cleanup
// registered after this call.
func MountAt(t testing.TB, dir string, size int64, mode string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("smallfs: mounting a tmpfs needs root")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d,mode=%s", size, mode)); err != nil {
		t.Skipf("smallfs: mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			t.Errorf("smallfs: unmount %s: %v", dir, err)
		}
	})
}

// Resize changes the size of the tmpfs mounted on dir (by Mount), keeping
// its files: the way a test frees space.
func Resize(t testing.TB, dir string, size int64) {
	t.Helper()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_REMOUNT, fmt.Sprintf("size=%d", size)); err != nil {
		t.Fatalf("smallfs: resize %s to %d bytes: %v", dir, size, err)
	}
}

// Free returns the bytes free on the filesystem of dir.
func Free(t testing.TB, dir string) int64 {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Bavail) * st.Bsize
}
