package target

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/stratadb/strata/core/config"
)

// benchOwnedKeys are the strata config keys a strata target sets itself
// (its temporary folder and ports); a target's config may not set them.
var benchOwnedKeys = map[string]bool{
	"cluster.data_dir":        true,
	"objectstore.fs.root":     true,
	"compute.port":            true,
	"cluster.safekeeper_port": true,
	"cluster.metrics_port":    true,
}

// CheckConfig checks the shape of a target's strata config keys (Config.Config):
// only kind strata takes them; every key is dotted lower case
// ("storage.pushdown_deltas") and not one the bench sets itself. Whether a
// key exists and its value is valid is checked by NewStrata, which loads the
// profile with the overrides.
func CheckConfig(cfg Config) error {
	if len(cfg.Config) == 0 {
		return nil
	}
	if cfg.Kind != "strata" {
		return fmt.Errorf("target %s: config (strata config keys) is for kind strata only, not %s", cfg.Name, cfg.Kind)
	}
	for _, k := range keys(cfg.Config) {
		if strings.TrimSpace(k) == "" {
			return fmt.Errorf("target %s: config: empty key", cfg.Name)
		}
		if !validKey(k) {
			return fmt.Errorf("target %s: config: key %q: want dotted lower-case words such as storage.pushdown_deltas", cfg.Name, k)
		}
		if benchOwnedKeys[k] {
			return fmt.Errorf("target %s: config: key %s is set by strata bench itself (each run gets its own folder and ports)", cfg.Name, k)
		}
	}
	return nil
}

func validKey(k string) bool {
	for _, part := range strings.Split(k, ".") {
		if part == "" {
			return false
		}
		for _, r := range part {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_') {
				return false
			}
		}
	}
	return true
}

// configEnv returns the STRATA_* environment overrides of cfg.Config, sorted.
func configEnv(cfg map[string]string) []string {
	out := make([]string, 0, len(cfg))
	for _, k := range keys(cfg) {
		out = append(out, config.EnvKey(k)+"="+cfg[k])
	}
	return out
}

// checkProfile loads the profile with the target's config keys set, the way
// `strata up` will, so that an unknown key or a bad value fails before any
// run. Environment overrides cannot report an unknown key (the loader only
// looks up the variables of known keys), so the keys are merged into a copy
// of the profile instead.
func checkProfile(cfg Config) error {
	b, err := os.ReadFile(cfg.Profile)
	if err != nil {
		return err
	}
	doc := map[string]any{}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return fmt.Errorf("profile %s: %w", cfg.Profile, err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	for _, k := range keys(cfg.Config) {
		var val any
		if err := yaml.Unmarshal([]byte(cfg.Config[k]), &val); err != nil || val == nil {
			val = cfg.Config[k]
		}
		m := doc
		parts := strings.Split(k, ".")
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = val
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "strata-bench-config-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	merged := filepath.Join(dir, filepath.Base(cfg.Profile))
	if err := os.WriteFile(merged, out, 0o600); err != nil {
		return err
	}
	if _, err := config.LoadEnv(merged, os.Environ()); err != nil {
		return fmt.Errorf("profile %s with config %s: %s", cfg.Profile, configLabel(cfg.Config), strings.ReplaceAll(err.Error(), merged, cfg.Profile))
	}
	return nil
}

// configLabel renders config keys sorted, "k=v k=v".
func configLabel(cfg map[string]string) string {
	parts := make([]string, 0, len(cfg))
	for _, k := range keys(cfg) {
		parts = append(parts, k+"="+cfg[k])
	}
	return strings.Join(parts, " ")
}
