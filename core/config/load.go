package config

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/viper"
	"gopkg.in/yaml.v3"
)

// EnvPrefix starts every environment variable that overrides a config key:
// objectstore.fs.root is STRATA_OBJECTSTORE_FS_ROOT.
const EnvPrefix = "STRATA_"

// Environment variables that carry the compute's secrets from strata up to
// the agent (never argv, which every user can read in /proc). They share
// the compute section's prefix but are not config keys.
const (
	EnvComputePassword     = EnvPrefix + "COMPUTE_PASSWORD"
	EnvComputeReplPassword = EnvPrefix + "COMPUTE_REPL_PASSWORD"
)

// ErrInvalid is wrapped by every error that Load returns for a bad file, key,
// type or value, so callers can tell bad configuration from I/O failures.
var ErrInvalid = errors.New("invalid config")

// Validator is implemented by config sections that check their own values.
// Validate returns an error whose text starts with the key it names, relative
// to the section (for example "root: required").
type Validator interface {
	Validate() error
}

// EnvKey returns the environment variable that overrides key.
func EnvKey(key string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// decodeFile reads the YAML file at path (or nothing when path is ""),
// applies STRATA_* overrides from env, and decodes the result strictly into
// out, which must be a pointer to a struct already holding the defaults.
func decodeFile(path string, env []string, out any) error {
	v := viper.New()
	v.SetConfigType("yaml")
	where := "defaults"
	if path != "" {
		where = path
		f, err := os.Open(path)
		if err != nil {
			// Invalid too: a supervisor must not restart a process whose
			// config file is missing or unreadable.
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		defer f.Close()
		if err := v.ReadConfig(f); err != nil {
			return fmt.Errorf("%w: %s: not valid YAML: %v", ErrInvalid, path, err)
		}
	}
	// Unknown keys first, so that a typo gets a message about the typo and not
	// about a value.
	if err := checkKeys(v.AllKeys(), reflect.TypeOf(out).Elem(), where); err != nil {
		return err
	}
	known, free := schemaKeys(reflect.TypeOf(out).Elem(), "")
	envs := map[string]string{}
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, EnvPrefix) {
			envs[k] = val
		}
	}
	if err := checkEnv(envs, known, free); err != nil {
		return err
	}
	keys := make([]string, 0, len(known))
	for k := range known {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		raw, ok := envs[EnvKey(k)]
		if !ok {
			continue
		}
		var val any
		if err := yaml.Unmarshal([]byte(raw), &val); err != nil || val == nil {
			val = raw
		}
		v.Set(k, val)
	}
	dec, err := mapstructure.NewDecoder(&mapstructure.DecoderConfig{
		Result:      out,
		ErrorUnused: true,
		DecodeHook: mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			numberToString,
		),
	})
	if err != nil {
		return err
	}
	if err := dec.Decode(v.AllSettings()); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrInvalid, where, cleanDecodeError(err))
	}
	return nil
}

// checkKeys returns an error naming the first of keys (dotted, as viper
// gives them) that the struct type t has no place for, with a suggestion.
func checkKeys(keys []string, t reflect.Type, where string) error {
	known, free := schemaKeys(t, "")
	var unknown []string
	for _, k := range keys {
		if !known[k] && !underFree(k, free) && !isParentOfKnown(k, known) {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	if len(unknown) == 0 {
		return nil
	}
	msg := fmt.Sprintf("%s: unknown key %s", where, unknown[0])
	if s := suggest(unknown[0], known); s != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", s)
	}
	if len(unknown) > 1 {
		msg += fmt.Sprintf(" (and %d more: %s)", len(unknown)-1, strings.Join(unknown[1:], ", "))
	}
	return fmt.Errorf("%w: %s", ErrInvalid, msg)
}

// checkEnv refuses a variable that names a config section (STRATA_CLUSTER_,
// STRATA_COMPUTE_, ...) but no key of it: a typo that would otherwise be
// ignored, leaving the default in force (a cache A/B run on the wrong
// strategy). Variables outside every section (STRATA_LONG_TESTS and the
// like) are not the config's to judge.
func checkEnv(envs map[string]string, known map[string]bool, free []string) error {
	names := map[string]bool{} // the variable of every key
	sections := map[string]bool{}
	for k := range known {
		names[EnvKey(k)] = true
		sec, _, _ := strings.Cut(k, ".")
		sections[EnvKey(sec)+"_"] = true
	}
	var unknown []string
	for name := range envs {
		if names[name] || name == EnvComputePassword || name == EnvComputeReplPassword {
			continue
		}
		for sec := range sections {
			if strings.HasPrefix(name, sec) {
				unknown = append(unknown, name)
				break
			}
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	sort.Strings(unknown)
	name := unknown[0]
	msg := fmt.Sprintf("environment: %s names no config key", name)
	// A variable for one entry of a free-form map: the map is one key.
	for _, f := range free {
		k := strings.TrimSuffix(f, ".")
		if env := EnvKey(k); strings.HasPrefix(name, env+"_") {
			msg += fmt.Sprintf(" (%s is one map: set the whole of it, %s='{%s: ...}')", k, env, strings.ToLower(strings.TrimPrefix(name, env+"_")))
			return fmt.Errorf("%w: %s", ErrInvalid, msg)
		}
	}
	if best := suggest(name, names); best != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", best)
	}
	if len(unknown) > 1 {
		msg += fmt.Sprintf(" (and %d more: %s)", len(unknown)-1, strings.Join(unknown[1:], ", "))
	}
	return fmt.Errorf("%w: %s", ErrInvalid, msg)
}

// numberToString lets a YAML number stand where a string is expected (a
// bucket named 2024), which YAML users expect; every other mismatch is an
// error.
func numberToString(f, t reflect.Type, data any) (any, error) {
	if t.Kind() != reflect.String {
		return data, nil
	}
	switch f.Kind() {
	case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Float64:
		return fmt.Sprint(data), nil
	}
	return data, nil
}

// cleanDecodeError turns mapstructure's multi-line report into one line per
// problem, each naming the key.
func cleanDecodeError(err error) string {
	var lines []string
	for _, l := range strings.Split(err.Error(), "\n") {
		l = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "*"))
		if l == "" || strings.HasSuffix(l, "error(s) decoding:") || strings.HasPrefix(l, "decoding failed") {
			continue
		}
		l = strings.ReplaceAll(l, "'", "")
		lines = append(lines, l)
	}
	if len(lines) == 0 {
		return err.Error()
	}
	return strings.Join(lines, "; ")
}

var durationType = reflect.TypeOf(time.Duration(0))

// schemaKeys returns every leaf key of the struct type t (dotted,
// lower-case, from mapstructure tags) and the prefixes of free-form maps.
func schemaKeys(t reflect.Type, prefix string) (map[string]bool, []string) {
	known := map[string]bool{}
	var free []string
	var walk func(t reflect.Type, prefix string)
	walk = func(t reflect.Type, prefix string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("mapstructure"), ",")
			if name == "-" {
				continue
			}
			if strings.Contains(opts, "squash") {
				walk(f.Type, prefix)
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			key := prefix + name
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch {
			case ft == durationType:
				known[key] = true
			case ft.Kind() == reflect.Struct:
				walk(ft, key+".")
			case ft.Kind() == reflect.Map:
				known[key] = true
				free = append(free, key+".")
			default:
				known[key] = true
			}
		}
	}
	walk(t, prefix)
	return known, free
}

func underFree(k string, free []string) bool {
	for _, p := range free {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	return false
}

// isParentOfKnown is true for a key that names a section (viper reports an
// empty section "a: {}" as a leaf).
func isParentOfKnown(k string, known map[string]bool) bool {
	for kk := range known {
		if strings.HasPrefix(kk, k+".") {
			return true
		}
	}
	return false
}

// suggest returns the known key closest to k by edit distance, if close.
func suggest(k string, known map[string]bool) string {
	best, bestD := "", 4
	for kk := range known {
		if d := editDistance(k, kk); d < bestD || (d == bestD && kk < best) {
			best, bestD = kk, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func reflectTypeOf[T any]() reflect.Type { return reflect.TypeOf((*T)(nil)).Elem() }
