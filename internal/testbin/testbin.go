// Package testbin gives tests the binaries they start as child processes
// (strata, the external object store plugins), built from this checkout
// once per test binary, or taken prebuilt from $STRATA_TEST_BIN_DIR.
//
// scripts/test.sh builds them there once for the whole run: each package
// that linked its own copy cost the run a link of strata (about 5 CPU-s)
// or of a plugin.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// DirEnv names the folder of prebuilt binaries. A binary missing there is
// built as without it.
const DirEnv = "STRATA_TEST_BIN_DIR"

// Strata returns the path of the strata binary.
func Strata(t testing.TB) string {
	t.Helper()
	return Path(t, "./cmd/strata")
}

// ObjectStorePlugin returns the path of the external object store plugin
// strata-objectstore-<name> (s3, gcs, azure, fs).
func ObjectStorePlugin(t testing.TB, name string) string {
	t.Helper()
	return Path(t, "./plugins/objectstore/"+name+"/cmd/strata-objectstore-"+name)
}

type build struct {
	once sync.Once
	path string
	err  error
}

var (
	mu     sync.Mutex
	builds = map[string]*build{}
	dir    string // this process's builds; removed by Cleanup
)

// Path returns the binary of the main package pkg, a path from the
// repository root such as "./cmd/strata"; the binary has the name go build
// gives it (the path's last element).
func Path(t testing.TB, pkg string) string {
	t.Helper()
	name := path.Base(pkg)
	if d := os.Getenv(DirEnv); d != "" {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	mu.Lock()
	b, ok := builds[pkg]
	if !ok {
		b = &build{}
		builds[pkg] = b
	}
	mu.Unlock()
	b.once.Do(func() { b.path, b.err = buildNow(pkg, name) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func buildNow(pkg, name string) (string, error) {
	mu.Lock()
	if dir == "" {
		d, err := os.MkdirTemp("", "strata-testbin-")
		if err != nil {
			mu.Unlock()
			return "", err
		}
		dir = d
	}
	out := filepath.Join(dir, name)
	mu.Unlock()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = Root()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

// Root is the repository's root folder: the nearest folder above the
// working directory (a test's is its package's folder) that holds go.mod.
// Not the source path of this file, which a build with -trimpath (as
// scripts/test.sh's) leaves relative.
func Root() string {
	dir, err := os.Getwd()
	if err != nil {
		panic(fmt.Sprintf("testbin: working directory: %v", err))
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			panic(fmt.Sprintf("testbin: no go.mod above %s", dir))
		}
	}
}

// Cleanup removes what this process built; a package's TestMain calls it
// after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
		dir = ""
	}
	builds = map[string]*build{}
}
