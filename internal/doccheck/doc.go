// Package doccheck finds the examples in the README and docs/ that tests
// check against the code (config keys in core/config, command lines in
// cmd/strata, the plugin guide's Go code here, the metrics reference
// here and in core/cluster), so that a change that
// breaks an example fails the build instead of a reader.
package doccheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
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

// Metric is a row of docs/metrics.md's tables.
type Metric struct {
	Name   string
	Type   string   // counter, gauge, histogram
	Labels []string // sorted
}

var metricRow = regexp.MustCompile("(?m)^\\| `(strata_[a-z0-9_]+)` \\| ([a-z]+) \\|([a-z_, ]*)\\|")

// Metrics returns the metrics docs/metrics.md documents, by name.
func Metrics(root string) (map[string]Metric, error) {
	b, err := os.ReadFile(filepath.Join(root, "docs", "metrics.md"))
	if err != nil {
		return nil, err
	}
	out := map[string]Metric{}
	for _, m := range metricRow.FindAllStringSubmatch(string(b), -1) {
		if _, dup := out[m[1]]; dup {
			return nil, fmt.Errorf("docs/metrics.md: %s documented twice", m[1])
		}
		var labels []string
		for _, l := range strings.Split(m[3], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		sort.Strings(labels)
		out[m[1]] = Metric{Name: m[1], Type: m[2], Labels: labels}
	}
	return out, nil
}

var (
	typeLine   = regexp.MustCompile(`(?m)^# TYPE (strata_[a-z0-9_]+) ([a-z]+)$`)
	sampleLine = regexp.MustCompile(`(?m)^(strata_[a-z0-9_]+)(?:\{([^}]*)\})? `)
	labelName  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
)

// CheckExposition compares a /metrics body with the documented metrics:
// every strata_* family in it must be documented, with its type and its
// label names. It returns the families found and one line per mismatch.
func CheckExposition(body string, docs map[string]Metric) (families []string, problems []string) {
	types := map[string]string{}
	for _, m := range typeLine.FindAllStringSubmatch(body, -1) {
		types[m[1]] = m[2]
		families = append(families, m[1])
		d, ok := docs[m[1]]
		switch {
		case !ok:
			problems = append(problems, m[1]+" is exported but not documented in docs/metrics.md")
		case d.Type != m[2]:
			problems = append(problems, fmt.Sprintf("%s is a %s, documented as a %s", m[1], m[2], d.Type))
		}
	}
	seen := map[string]bool{}
	for _, m := range sampleLine.FindAllStringSubmatch(body, -1) {
		name := m[1]
		if _, ok := types[name]; !ok {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				if base := strings.TrimSuffix(name, suf); base != name && types[base] == "histogram" {
					name = base
				}
			}
		}
		d, ok := docs[name]
		if !ok || seen[name] {
			continue
		}
		seen[name] = true
		var got []string
		for _, l := range labelName.FindAllStringSubmatch(m[2], -1) {
			if l[1] != "le" {
				got = append(got, l[1])
			}
		}
		sort.Strings(got)
		if strings.Join(got, ",") != strings.Join(d.Labels, ",") {
			problems = append(problems, fmt.Sprintf("%s has labels [%s], documented [%s]", name, strings.Join(got, ", "), strings.Join(d.Labels, ", ")))
		}
	}
	return families, problems
}
