package agent

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCopyTree copies a tree like initdb's output (nested folders, two
// database folders, empty and multi-megabyte files, a link) and compares
// every entry; a copy that fails part way has not copied the file named
// last, and the source is left as it was.
func TestCopyTree(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	rng := rand.New(rand.NewPCG(1, 2))
	files := map[string]int{
		"PG_VERSION":          3,
		"base/1/1259":         8192 * 3,
		"base/1/1259_fsm":     0,
		"base/5/16384":        3<<20 + 8192, // many of cp's writes
		"global/pg_control":   8192,
		"pg_xact/0000":        8192,
		"pg_logical/snapshot": 0,
		"postgresql.conf":     100,
	}
	for _, d := range []string{"base/1", "base/5", "global", "pg_xact", "pg_logical", "pg_tblspc"} {
		if err := os.MkdirAll(filepath.Join(src, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for name, size := range files {
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		if err := os.WriteFile(filepath.Join(src, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/somewhere/pg_wal", filepath.Join(src, "pg_wal")); err != nil {
		t.Fatal(err)
	}

	n, size, err := copyTree(context.Background(), src, dst, "global/pg_control")
	if err != nil {
		t.Fatal(err)
	}
	want := int64(0)
	for _, s := range files {
		want += int64(s)
	}
	if n != len(files) || size != want {
		t.Fatalf("copied %d files, %d bytes; want %d, %d", n, size, len(files), want)
	}
	err = filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		to := filepath.Join(dst, rel)
		a, _ := os.Lstat(path)
		b, err := os.Lstat(to)
		if err != nil {
			t.Errorf("%s: not copied: %v", rel, err)
			return nil
		}
		if a.Mode() != b.Mode() {
			t.Errorf("%s: mode %v, want %v", rel, b.Mode(), a.Mode())
		}
		switch {
		case a.Mode()&fs.ModeSymlink != 0:
			x, _ := os.Readlink(path)
			y, _ := os.Readlink(to)
			if x != y {
				t.Errorf("%s: link to %q, want %q", rel, y, x)
			}
		case a.Mode().IsRegular():
			x, _ := os.ReadFile(path)
			y, _ := os.ReadFile(to)
			if !bytes.Equal(x, y) {
				t.Errorf("%s: content differs (%d bytes, want %d)", rel, len(y), len(x))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	// A copy that fails part way has not copied the files named last,
	// even where the failing file comes after them in the folder's order.
	dst2 := t.TempDir()
	if err := os.Mkdir(filepath.Join(dst2, "postgresql.conf"), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := copyTree(context.Background(), src, dst2, "global/pg_control"); err == nil || !strings.Contains(err.Error(), "postgresql.conf") {
		t.Fatalf("a copy onto a folder where a file goes: %v, want an error naming it", err)
	}
	if _, err := os.Stat(filepath.Join(dst2, "global/pg_control")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("global/pg_control after a failed copy: %v, want it absent", err)
	}
	// The source is unchanged: the files copied last are back in place.
	if _, err := os.Stat(filepath.Join(src, "global/pg_control")); err != nil {
		t.Fatalf("the source after the copies: %v", err)
	}
}
