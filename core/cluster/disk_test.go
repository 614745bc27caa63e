package cluster

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stratadb/strata/internal/smallfs"
)

func writeBytes(t *testing.T, path string, n int) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, make([]byte, n), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDirBytes: dirBytes counts the files under a folder as du does, and
// leaves out the folder it is told to skip (the FUSE PGDATA) and another
// filesystem mounted below (a real tmpfs).
func TestDirBytes(t *testing.T) {
	root := t.TempDir()
	writeBytes(t, filepath.Join(root, "a", "seg"), 1<<20)
	writeBytes(t, filepath.Join(root, "b"), 3<<20)
	writeBytes(t, filepath.Join(root, "pgdata", "base", "1"), 5<<20)
	n, err := dirBytes(root, filepath.Join(root, "pgdata"))
	if err != nil {
		t.Fatal(err)
	}
	// 4 MiB of data plus the folders' own blocks.
	if n < 4<<20 || n > 4<<20+64<<10 {
		t.Fatalf("dirBytes = %d, want 4 MiB and the folders (pgdata left out)", n)
	}
	if _, err := dirBytes(filepath.Join(root, "missing"), ""); !os.IsNotExist(err) {
		t.Fatalf("a missing folder: err = %v, want not-exist", err)
	}

	mnt := filepath.Join(root, "shm")
	smallfs.MountAt(t, mnt, 16<<20, "0755")
	writeBytes(t, filepath.Join(mnt, "pg_wal", "000000010000000000000001"), 8<<20)
	m, err := dirBytes(root, filepath.Join(root, "pgdata"))
	if err != nil {
		t.Fatal(err)
	}
	if m-n > 64<<10 {
		t.Fatalf("dirBytes grew from %d to %d: it counted the tmpfs mounted below", n, m)
	}
}

func TestFmtBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 3 << 30: "3.0 GiB", 252 << 30: "252.0 GiB"} {
		if got := fmtBytes(n); got != want {
			t.Errorf("fmtBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
