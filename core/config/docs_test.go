package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/viper"

	"github.com/stratadb/strata/internal/doccheck"
)

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
	blocks, err := doccheck.Blocks("../..", doccheck.Files("../.."), "yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range blocks {
		v := viper.New()
		v.SetConfigType("yaml")
		if err := v.ReadConfig(strings.NewReader(b.Text)); err != nil {
			t.Errorf("%s: not valid YAML: %v", b.Where(), err)
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
			t.Errorf("%s: a YAML block with top-level keys %v is neither a strata config (sections %v) nor a benchmark matrix", b.Where(), tops, sections)
			continue
		}
		if err := checkKeys(v.AllKeys(), ct, b.Where()); err != nil {
			t.Error(err)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no configuration example found in the docs")
	}
	t.Logf("%d configuration examples checked", checked)
}
