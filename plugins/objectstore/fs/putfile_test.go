package fs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// On the root's filesystem PutFile makes the object a hard link to the
// file (no byte copied), also through the wrappers strata puts around
// every store; from another filesystem it copies.
func TestPutFileLinksOnTheSameFilesystem(t *testing.T) {
	root := t.TempDir()
	s := open(t, Config{Root: root})
	reg := prometheus.NewRegistry()
	st := objectstore.WithRetry(objectstore.WithMetrics(s, reg, "fs"), objectstore.DefaultRetryPolicy(), zerolog.Nop())
	ctx := context.Background()

	src := filepath.Join(root, "..", filepath.Base(root)+"-layer")
	data := make([]byte, 1<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(src)
	if err := objectstore.PutFile(ctx, st, "layers/t/1", src, objectstore.PutOptions{Size: int64(len(data))}); err != nil {
		t.Fatal(err)
	}
	same, obj := sameFile(t, s, "layers/t/1", src)
	if !same {
		t.Fatal("the object is a copy, not a link to the file")
	}
	if obj.Mode().Perm() != 0o644 {
		t.Fatalf("object mode %v, want 0644", obj.Mode().Perm())
	}
	if got := writtenBytes(t, reg); got != float64(len(data)) {
		t.Fatalf("written bytes metric %v, want %d", got, len(data))
	}
	if n := tmpEntries(t, s); n != 0 {
		t.Fatalf("%d files left in the temporary area", n)
	}

	// Another filesystem: a copy.
	other := otherFilesystem(t, root)
	src2 := filepath.Join(other, "layer")
	if err := os.WriteFile(src2, data[:1000], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := objectstore.PutFile(ctx, st, "layers/t/2", src2, objectstore.PutOptions{Size: 1000}); err != nil {
		t.Fatal(err)
	}
	if same, obj := sameFile(t, s, "layers/t/2", src2); same || obj.Size() != 1000 {
		t.Fatalf("cross-filesystem PutFile: same file %v, size %d", same, obj.Size())
	}
	if n := tmpEntries(t, s); n != 0 {
		t.Fatalf("%d files left in the temporary area", n)
	}
}

// otherFilesystem makes a folder (removed at cleanup) on a filesystem other
// than dir's: /dev/shm, /var/tmp or the working directory, whichever is the
// first one that is (the tests' TMPDIR may itself be on /dev/shm).
func otherFilesystem(t *testing.T, dir string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		t.Fatal(err)
	}
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"/dev/shm", "/var/tmp", wd} {
		var cst syscall.Stat_t
		if syscall.Stat(c, &cst) != nil || cst.Dev == st.Dev {
			continue
		}
		d, err := os.MkdirTemp(c, ".strata-putfile-")
		if err != nil {
			continue
		}
		t.Cleanup(func() { os.RemoveAll(d) })
		return d
	}
	t.Skipf("no writable folder on a filesystem other than %s's", dir)
	return ""
}

// sameFile reports whether key's object is the file src (a hard link),
// and returns the object's file info.
func sameFile(t *testing.T, s *Store, key, src string) (bool, os.FileInfo) {
	t.Helper()
	path, err := s.Path(key)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Stat(src)
	if err != nil {
		t.Fatal(err)
	}
	return os.SameFile(obj, f), obj
}

func tmpEntries(t *testing.T, s *Store) int {
	t.Helper()
	es, err := os.ReadDir(s.tmp.dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func writtenBytes(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "strata_objectstore_written_bytes_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatal("no strata_objectstore_written_bytes_total")
	return 0
}
