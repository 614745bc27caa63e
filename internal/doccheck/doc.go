// Package doccheck finds the examples in the README and docs/ that tests
// check against the code (config keys in core/config, command lines in
// cmd/strata, the plugin guide's Go code here), so that a change that
// breaks an example fails the build instead of a reader.
package doccheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// Block is a fenced code block of a Markdown file.
type Block struct {
	File string // relative to the repository root
	Line int    // of the opening fence
	Text string
}

// Where is "file:line".
func (b Block) Where() string { return b.File + ":" + strconv.Itoa(b.Line) }

// Files returns the README and every Markdown file of docs/ and its
// subfolders, relative to root (the repository root).
func Files(root string) []string {
	files := []string{"README.md"}
	for _, g := range []string{"docs/*.md", "docs/*/*.md"} {
		m, _ := filepath.Glob(filepath.Join(root, g))
		for _, f := range m {
			rel, _ := filepath.Rel(root, f)
			files = append(files, rel)
		}
	}
	return files
}

// Blocks returns the fenced blocks of the given languages ("yaml"; ""
// for a fence without one) in the files, in order.
func Blocks(root string, files []string, langs ...string) ([]Block, error) {
	fence := regexp.MustCompile("(?s)```(" + strings.Join(quoteAll(langs), "|") + ")\n(.*?)```")
	var out []Block
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		for _, m := range fence.FindAllSubmatchIndex(b, -1) {
			out = append(out, Block{File: f, Line: 1 + strings.Count(string(b[:m[0]]), "\n"), Text: string(b[m[4]:m[5]])})
		}
	}
	return out, nil
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = regexp.QuoteMeta(s)
	}
	return out
}
