package target

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/testbin"
)

func localProfile(t *testing.T) string {
	return filepath.Join(testbin.Root(), "configs", "local.yaml")
}

// TestStrataConfigKeys checks the config: field of a strata target: keys
// become STRATA_* overrides, and a bad key or value fails in NewStrata
// with an error that names the target.
func TestStrataConfigKeys(t *testing.T) {
	profile := localProfile(t)
	good := map[string]string{"storage.page_source": "redo", "storage.image_policy": "fpi", "compute.full_page_writes": "true"}
	tg, err := NewStrata(Config{Name: "fpi", Kind: "strata", Profile: profile, Strata: "/bin/true", Config: good}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	st := tg.(*strataTarget)
	if err := st.prepare(); err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(st.root)
	env := strings.Join(st.env, "\n")
	for _, want := range []string{"STRATA_STORAGE_PAGE_SOURCE=redo", "STRATA_STORAGE_IMAGE_POLICY=fpi", "STRATA_COMPUTE_FULL_PAGE_WRITES=true",
		"STRATA_CLUSTER_DATA_DIR=" + filepath.Join(st.root, "cluster")} {
		if !strings.Contains(env, want+"\n") {
			t.Errorf("environment lacks %s", want)
		}
	}

	for _, c := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"empty key", Config{Kind: "strata", Config: map[string]string{"": "x"}}, []string{"target t", "empty key"}},
		{"bad key", Config{Kind: "strata", Config: map[string]string{"Storage..x": "1"}}, []string{"target t", "Storage..x"}},
		{"owned key", Config{Kind: "strata", Config: map[string]string{"cluster.data_dir": "/tmp/x"}}, []string{"target t", "set by strata bench"}},
		{"unknown key", Config{Kind: "strata", Config: map[string]string{"storage.image_polcy": "fpi"}}, []string{"target t", "unknown key storage.image_polcy", "did you mean storage.image_policy"}},
		{"bad value", Config{Kind: "strata", Config: map[string]string{"storage.image_policy": "bogus"}}, []string{"target t", "storage.image_policy", "bogus"}},
		{"bad combination", Config{Kind: "strata", Config: map[string]string{"storage.page_source": "redo"}}, []string{"target t", "writeback with page_source redo"}},
		{"wrong kind", Config{Kind: "stock", Config: map[string]string{"storage.image_policy": "fpi"}}, []string{"target t", "kind strata only"}},
	} {
		cfg := c.cfg
		cfg.Name, cfg.Profile = "t", profile
		var err error
		if cfg.Kind == "strata" {
			_, err = NewStrata(cfg, zerolog.Nop())
		} else {
			err = CheckConfig(cfg)
		}
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", c.name, err, w)
			}
		}
	}
}

// TestStrataMetricsURLs checks that a strata target without metrics_url
// finds its pageserver's, compute agent's and safekeepers' /metrics in
// cluster.json, and that metrics_url wins when set.
func TestStrataMetricsURLs(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "cluster"), 0o755); err != nil {
		t.Fatal(err)
	}
	state := `{"procs": [
		{"name": "safekeeper sk1", "pid": 1, "args": ["safekeeper", "--metrics-addr", "127.0.0.1:9676"]},
		{"name": "pageserver", "pid": 2, "args": ["--config", "c.yaml", "pageserver", "--listen", "127.0.0.1:7000", "--metrics-addr", "127.0.0.1:9679", "--image-policy", "fpi"]},
		{"name": "compute", "pid": 3, "args": ["compute", "--metrics-addr", "127.0.0.1:9680"]}]}`
	if err := os.WriteFile(filepath.Join(root, "cluster", "cluster.json"), []byte(state), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &strataTarget{cfg: Config{Name: "s"}, root: root, running: true, log: zerolog.Nop()}
	got := s.MetricsURLs()
	if len(got) != 3 || got["pageserver"] != "http://127.0.0.1:9679/metrics" || got["compute"] != "http://127.0.0.1:9680/metrics" ||
		got["sk1"] != "http://127.0.0.1:9676/metrics" {
		t.Errorf("metrics endpoints: %v", got)
	}
	// cluster.metrics_port 0: the pageserver gets an empty address, the
	// others none.
	off := strings.ReplaceAll(strings.ReplaceAll(state, `"--metrics-addr", "127.0.0.1:9679"`, `"--metrics-addr", ""`), `"compute", "--metrics-addr", "127.0.0.1:9680"`, `"compute"`)
	off = strings.ReplaceAll(off, `"safekeeper", "--metrics-addr", "127.0.0.1:9676"`, `"safekeeper"`)
	if err := os.WriteFile(filepath.Join(root, "cluster", "cluster.json"), []byte(off), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := s.MetricsURLs(); len(got) != 0 {
		t.Errorf("metrics off: endpoints %v", got)
	}
	s.cfg.MetricsURL = "http://127.0.0.1:1/metrics"
	if got := s.MetricsURLs(); len(got) != 1 || got[""] != s.cfg.MetricsURL {
		t.Errorf("metrics_url set: endpoints %v", got)
	}
}
