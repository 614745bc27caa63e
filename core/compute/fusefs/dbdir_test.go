package fusefs

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// TestDatabaseDirHook: Options.OnDatabaseDir hears of each database folder
// made under base/ (as CREATE DATABASE makes it), and of nothing else.
func TestDatabaseDirHook(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var got []uint32
	e.onDB = func(oid uint32) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, oid)
	}
	e.mount(t, NewMemory(), nil)
	for _, d := range []string{"base", "global", "global/16384", "base/1", "base/pgsql_tmp", "base/16384", "base/16384/17000", "pg_tblspc", "base/4294967296", "base/4294967295"} {
		if err := os.Mkdir(filepath.Join(e.mnt, d), 0o700); err != nil {
			t.Fatalf("mkdir %s: %v", d, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []uint32{1, 16384, 4294967295}; !slices.Equal(got, want) {
		t.Fatalf("OnDatabaseDir heard %v, want %v", got, want)
	}
}
