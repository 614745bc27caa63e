package config

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/viper"
)

// yamlBlock is a ```yaml block of a Markdown file and where it starts.
type yamlBlock struct {
	where string // file:line
	text  string
}

var fence = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// docYAMLBlocks returns every ```yaml block of the README and docs/.
func docYAMLBlocks(t *testing.T) []yamlBlock {
	t.Helper()
	files := []string{"../../README.md"}
	for _, g := range []string{"../../docs/*.md", "../../docs/*/*.md"} {
		m, _ := filepath.Glob(g)
		files = append(files, m...)
	}
	var out []yamlBlock
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fence.FindAllSubmatchIndex(b, -1) {
			line := 1 + bytes.Count(b[:m[0]], []byte("\n"))
			out = append(out, yamlBlock{where: strings.TrimPrefix(f, "../../") + ":" + strconv.Itoa(line), text: string(b[m[2]:m[3]])})
		}
	}
	return out
}

// TestDocsConfigKeys: every key of every strata configuration example in
// the README and docs/ is one the loader knows (values may be
// placeholders such as "..."; keys may not). A block whose top-level keys
// are not configuration sections must be a benchmark matrix (checked by
// core/bench/matrix's own test), so a configuration example under a
// section the file does not have (safekeeper:, pageserver:) fails here.
func TestDocsConfigKeys(t *testing.T) {
	sections := map[string]bool{}
	ct := reflect.TypeOf(Config{})
	for i := 0; i < ct.NumField(); i++ {
		if name, _, _ := strings.Cut(ct.Field(i).Tag.Get("mapstructure"), ","); name != "-" && name != "" {
			sections[name] = true
		}
	}
	checked := 0
	for _, b := range docYAMLBlocks(t) {
		v := viper.New()
		v.SetConfigType("yaml")
		if err := v.ReadConfig(strings.NewReader(b.text)); err != nil {
			t.Errorf("%s: not valid YAML: %v", b.where, err)
			continue
		}
		var tops []string
		isConfig := false
		for k := range v.AllSettings() {
			tops = append(tops, k)
			isConfig = isConfig || sections[k]
		}
		if !isConfig {
			if v.IsSet("workload") && v.IsSet("targets") {
				continue // a benchmark matrix
			}
			t.Errorf("%s: a YAML block with top-level keys %v is neither a strata config (sections %v) nor a benchmark matrix", b.where, tops, sections)
			continue
		}
		if err := checkKeys(v.AllKeys(), ct, b.where); err != nil {
			t.Error(err)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no configuration example found in the docs")
	}
	t.Logf("%d configuration examples checked", checked)
}
