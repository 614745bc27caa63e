package doccheck

import (
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// imports maps the package names the guide's fragments use without an
// import line to their paths.
var imports = map[string]string{
	"cache":       "github.com/stratadb/strata/sdk/cache",
	"context":     "context",
	"exec":        "os/exec",
	"filepath":    "path/filepath",
	"json":        "encoding/json",
	"objectstore": "github.com/stratadb/strata/sdk/objectstore",
	"pluginhost":  "github.com/stratadb/strata/core/pluginhost",
	"storetest":   "github.com/stratadb/strata/sdk/objectstore/storetest",
	"testing":     "testing",
	"zerolog":     "github.com/rs/zerolog",
}

// stubs are what the guide leaves to the plugin author: the store itself
// and a test's fresh bucket.
const stubs = `package main

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

func newMyStore(cfg config, log zerolog.Logger) (objectstore.Store, error) {
	return objectstore.NewMemory(), nil
}

func freshBucket(t *testing.T) string { return t.Name() }
`

// importBlock returns the import declaration for the packages src uses.
func importBlock(src string) string {
	src = regexp.MustCompile(`(?m)//.*$`).ReplaceAllString(src, "")
	var paths []string
	for name, path := range imports {
		if regexp.MustCompile(`\b` + name + `\.`).MatchString(src) {
			paths = append(paths, fmt.Sprintf("%q", path))
		}
	}
	sort.Strings(paths)
	if len(paths) == 0 {
		return ""
	}
	return "import (\n\t" + strings.Join(paths, "\n\t") + "\n)\n"
}

// TestPluginGuideCompiles type-checks every Go block of docs/plugins.md:
// the program (package main), the test functions (as its tests, with the
// guide's config type and a stub store), statement fragments (in a
// function that has ctx and log) and method signatures (in an interface).
func TestPluginGuideCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := Blocks(root, []string{"docs/plugins.md"}, "go")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	kinds := map[string]int{}
	var frags, sigs []string
	for i, blk := range blocks {
		b := blk.Text
		switch {
		case strings.HasPrefix(b, "package "):
			write(fmt.Sprintf("block%d.go", i), b)
			kinds["program"]++
		case strings.HasPrefix(b, "func Test"):
			write(fmt.Sprintf("block%d_test.go", i), "package main\n\n"+importBlock(b)+"\n"+b)
			kinds["test"]++
		default:
			fset := token.NewFileSet()
			if _, err := parser.ParseFile(fset, "", "package p\nfunc _() {\n"+b+"\n}\n", 0); err == nil {
				frags = append(frags, b)
				kinds["fragment"]++
			} else if _, err := parser.ParseFile(fset, "", "package p\ntype _ interface {\n"+b+"\n}\n", 0); err == nil {
				sigs = append(sigs, b)
				kinds["signature"]++
			} else {
				t.Errorf("%s: a Go block that is neither a file, a test, statements nor a method signature:\n%s", blk.Where(), b)
			}
		}
	}
	if kinds["program"] != 1 || kinds["test"] == 0 || kinds["fragment"] == 0 {
		t.Fatalf("the guide's Go blocks changed shape (%v): update this test", kinds)
	}
	var extra strings.Builder
	for i, f := range frags {
		// A fragment's results are for the reader; the compiler must not
		// call them unused.
		vars := regexp.MustCompile(`(?m)^(\w+), (\w+) :=`).FindAllStringSubmatch(f, -1)
		fmt.Fprintf(&extra, "func fragment%d(ctx context.Context, log zerolog.Logger) {\n%s\n", i, f)
		for _, v := range vars {
			fmt.Fprintf(&extra, "_, _ = %s, %s\n", v[1], v[2])
		}
		extra.WriteString("}\n\n")
	}
	for i, s := range sigs {
		fmt.Fprintf(&extra, "type signature%d interface {\n%s\n}\n\n", i, s)
	}
	body := extra.String()
	write("fragments.go", "package main\n\n"+importBlock(body+" context. zerolog.")+"\n"+body)
	write("stubs.go", stubs)
	write("go.mod", fmt.Sprintf("module doccheck\n\ngo 1.26\n\nrequire github.com/stratadb/strata v0.0.0\n\nreplace github.com/stratadb/strata => %s\n", root))
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write("go.sum", string(sum))
	cmd := exec.Command("go", "vet", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod -buildvcs=false", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Go examples of docs/plugins.md do not compile against the SDK: %v\n%s", err, out)
	}
	t.Logf("compiled %v", kinds)
}
