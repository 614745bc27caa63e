package config

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "strata.yaml")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestShippedProfilesLoad(t *testing.T) {
	profiles, _ := filepath.Glob("../../configs/*.yaml")
	if len(profiles) == 0 {
		t.Fatal("no profiles found in configs/")
	}
	for _, p := range profiles {
		if _, err := LoadEnv(p, nil); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

func TestLocalProfile(t *testing.T) {
	cfg, err := LoadEnv("../../configs/local.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ObjectStore.Type != "fs" || cfg.ObjectStore.FS.Root != "./.strata/objects" || cfg.Cluster.DataDir != "./.strata" {
		t.Fatalf("unexpected local profile: %+v", cfg)
	}
}

func TestDefaultsOnly(t *testing.T) {
	cfg, err := LoadEnv("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ObjectStore.Type != "fs" || cfg.Log.Level != "info" || cfg.Cluster.SafekeeperGOMAXPROCS != 1 || !cfg.Cluster.SafekeeperRawSyscalls {
		t.Fatalf("defaults: %+v", cfg)
	}
	cfg, err = LoadEnv("", []string{"STRATA_CLUSTER_SAFEKEEPER_GOMAXPROCS=0"})
	if err != nil || cfg.Cluster.SafekeeperGOMAXPROCS != 0 {
		t.Fatalf("cluster.safekeeper_gomaxprocs from the environment: %+v, %v", cfg.Cluster, err)
	}
	cfg, err = LoadEnv(writeFile(t, "cluster:\n  safekeeper_raw_syscalls: false\n"), nil)
	if err != nil || cfg.Cluster.SafekeeperRawSyscalls {
		t.Fatalf("cluster.safekeeper_raw_syscalls: false in the file: %+v, %v", cfg.Cluster, err)
	}
	if n, err := Default().Cluster.SafekeeperWALRetainBytes(); err != nil || n != 1<<30 {
		t.Fatalf("default cluster.safekeeper_wal_retain: %d, %v", n, err)
	}
	cfg, err = LoadEnv("", []string{"STRATA_CLUSTER_SAFEKEEPER_WAL_RETAIN=0"})
	if n, _ := cfg.Cluster.SafekeeperWALRetainBytes(); err != nil || n != 0 {
		t.Fatalf("cluster.safekeeper_wal_retain 0 from the environment: %+v, %v", cfg.Cluster, err)
	}
	_, err = LoadEnv(writeFile(t, "cluster:\n  safekeeper_wal_retain: 2 parsecs\n"), nil)
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "cluster.safekeeper_wal_retain") {
		t.Fatalf("a bad cluster.safekeeper_wal_retain: %v", err)
	}
}

func TestEnvOverrides(t *testing.T) {
	p := writeFile(t, "objectstore:\n  type: fs\n  fs:\n    root: /a\n")
	cfg, err := LoadEnv(p, []string{
		"STRATA_OBJECTSTORE_FS_ROOT=/b",
		"STRATA_LOG_LEVEL=debug",
		"STRATA_OBJECTSTORE_S3_PATH_STYLE=true",
		"STRATA_OBJECTSTORE_S3_PART_SIZE=6291456",
		"UNRELATED=1",
	})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ObjectStore.FS.Root != "/b" || cfg.Log.Level != "debug" {
		t.Fatalf("env not applied: %+v", cfg)
	}
	if !cfg.ObjectStore.S3.PathStyle || cfg.ObjectStore.S3.PartSize != 6<<20 {
		t.Fatalf("typed env not applied: %+v", cfg.ObjectStore.S3)
	}
	if got := EnvKey("objectstore.fs.root"); got != "STRATA_OBJECTSTORE_FS_ROOT" {
		t.Fatalf("EnvKey = %s", got)
	}
}

// TestEnvUnknownVariable: a variable under a section's prefix that names
// no key is refused, like an unknown key in the file; strata's own
// variables and those outside every section are left alone.
func TestEnvUnknownVariable(t *testing.T) {
	for _, c := range []struct{ env, want string }{
		{"STRATA_COMPUTE_CACHE_STRATEGYY=lfc", "STRATA_COMPUTE_CACHE_STRATEGYY names no config key (did you mean STRATA_COMPUTE_CACHE_STRATEGY?)"},
		{"STRATA_CLUSTER_SAFEKEEPRS=3", "did you mean STRATA_CLUSTER_SAFEKEEPERS?"},
		{"STRATA_COMPUTE_SETTINGS_COMMIT_DELAY=10", "compute.settings is one map: set the whole of it, STRATA_COMPUTE_SETTINGS='{commit_delay: ...}'"},
		{"STRATA_LOG_LEVL=debug", "did you mean STRATA_LOG_LEVEL?"},
	} {
		_, err := LoadEnv("", []string{c.env})
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an invalid-config error with %q", c.env, err, c.want)
		}
	}
	cfg, err := LoadEnv("", []string{
		EnvComputePassword + "=secret", EnvComputeReplPassword + "=secret",
		"STRATA_LONG_TESTS=1", "STRATA_SAFEKEEPER_POSTGRES=postgres://x", "STRATA_COMPUTE_CACHE_STRATEGY=lfc",
	})
	if err != nil || cfg.Compute.Cache.Strategy != "lfc" {
		t.Fatalf("strata's own variables: %v", err)
	}
}

func TestErrorsNameKeyAndFile(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		env        []string
		want       []string
	}{
		{"unknown key", "objectstore:\n  fs:\n    rot: /x\n", nil, []string{"unknown key objectstore.fs.rot", "did you mean objectstore.fs.root"}},
		{"unknown section", "pageservr:\n  x: 1\n", nil, []string{"unknown key pageservr.x"}},
		{"wrong type", "objectstore:\n  type: s3\n  s3:\n    bucket: b\n    path_style: [1, 2]\n", nil, []string{"objectstore.s3.path_style"}},
		{"wrong type int", "objectstore:\n  type: s3\n  s3:\n    bucket: b\n    part_size: big\n", nil, []string{"objectstore.s3.part_size"}},
		{"missing required", "objectstore:\n  type: s3\n", nil, []string{"objectstore.s3.bucket: required"}},
		{"bad mode", "objectstore:\n  mode: sideways\n", nil, []string{"objectstore.mode", "sideways"}},
		{"external without path", "objectstore:\n  mode: external\n", nil, []string{"objectstore.plugin.path: required"}},
		{"unknown builtin", "objectstore:\n  type: ftp\n", nil, []string{"objectstore.type", "ftp"}},
		{"bad yaml", "objectstore: [\n", nil, []string{"not valid YAML"}},
		{"bad env value", "", []string{"STRATA_LOG_LEVEL=loud"}, []string{"log.level", "loud"}},
		{"bad strategy", "compute:\n  cache:\n    strategy: l2arc\n", nil, []string{"compute.cache.strategy", "l2arc"}},
		{"lfc size in the file", "compute:\n  cache:\n    lfc:\n      size_bytes: 1000000\n", nil, []string{"unknown key compute.cache.lfc.size_bytes"}},
		{"advisor without lfc", "compute:\n  cache:\n    advisor:\n      plugin:\n        path: /bin/true\n", nil, []string{"compute.cache.advisor", "needs compute.cache.strategy lfc"}},
		{"advisor too often", "compute:\n  cache:\n    strategy: lfc\n    advisor:\n      every: 1ms\n      plugin:\n        path: /bin/true\n", nil, []string{"compute.cache.advisor.every", "1ms"}},
		{"advisor settings without a path", "compute:\n  cache:\n    advisor:\n      plugin:\n        sha256: abc\n", nil, []string{"compute.cache.advisor.plugin", "without a path"}},
		{"unknown advisor key", "compute:\n  cache:\n    advisor:\n      evry: 1s\n", nil, []string{"unknown key compute.cache.advisor.evry"}},
		{"bad prewarm interval", "compute:\n  cache:\n    prewarm_interval: 10ms\n", nil, []string{"compute.cache.prewarm_interval", "10ms"}},
		{"bad budget", "compute:\n  memory_budget: lots\n", nil, []string{"compute.memory_budget", "lots"}},
		{"budget too small", "compute:\n  memory_budget: 100kB\n", nil, []string{"compute.memory_budget", "too small"}},
		{"budget too small for lfc", "compute:\n  memory_budget: 1MB\n  cache:\n    strategy: lfc\n", nil, []string{"compute.memory_budget", "too small"}},
		{"bad partitions", "compute:\n  cache:\n    lfc:\n      partitions: 0\n", nil, []string{"compute.cache.lfc.partitions"}},
		{"unknown lfc key", "compute:\n  cache:\n    lfc:\n      partitons: 4\n", nil, []string{"unknown key compute.cache.lfc.partitons", "did you mean compute.cache.lfc.partitions"}},
		{"bad page source", "storage:\n  page_source: magic\n", nil, []string{"storage.page_source", "magic"}},
		{"bad image policy", "storage:\n  image_policy: sometimes\n", nil, []string{"storage.image_policy", "sometimes"}},
		{"bad pushdown deltas", "storage:\n  pushdown_deltas: 0\n", nil, []string{"storage.pushdown_deltas", "positive"}},
		{"bad pushdown deltas env", "", []string{"STRATA_STORAGE_PUSHDOWN_DELTAS=-3"}, []string{"storage.pushdown_deltas", "-3"}},
		{"bad hot burst", "storage:\n  hot_burst: 0\n", nil, []string{"storage.hot_burst"}},
		{"bad pitr", "storage:\n  pitr: an hour\n", nil, []string{"storage.pitr"}},
		{"negative pitr", "storage:\n  pitr: -5m\n", nil, []string{"storage.pitr", "-5m"}},
		{"bad gc horizon", "storage:\n  gc_horizon: plenty\n", nil, []string{"storage.gc_horizon", "plenty"}},
		{"bad image layer bytes", "storage:\n  image_layer_bytes: lots\n", nil, []string{"storage.image_layer_bytes", "lots"}},
		{"tiny image layer bytes", "storage:\n  image_layer_bytes: 64kB\n", nil, []string{"storage.image_layer_bytes", "64kB", "at least 1MiB"}},
		{"bad pageserver port", "cluster:\n  pageserver_port: 70000\n", nil, []string{"cluster.pageserver_port", "70000"}},
		{"negative safekeeper gomaxprocs", "cluster:\n  safekeeper_gomaxprocs: -2\n", nil, []string{"cluster.safekeeper_gomaxprocs", "-2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, tc.yaml)
			_, err := LoadEnv(p, tc.env)
			if err == nil {
				t.Fatal("want an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not match ErrInvalid", err)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error spans lines: %q", msg)
			}
			for _, w := range append(tc.want, p) {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not mention %q", msg, w)
				}
			}
		})
	}
}

func TestStorageRetention(t *testing.T) {
	cfg, err := LoadEnv("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := cfg.Storage.GCHorizonBytes(); cfg.Storage.PITR != time.Hour || err != nil || h != 64<<20 {
		t.Fatalf("defaults: pitr %s, gc_horizon %d (%v); want 1h, 64 MiB", cfg.Storage.PITR, h, err)
	}
	cfg, err = LoadEnv(writeFile(t, "storage:\n  pitr: 5m\n  gc_horizon: 1GB\n"), []string{"STRATA_STORAGE_PITR=90s"})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := cfg.Storage.GCHorizonBytes(); cfg.Storage.PITR != 90*time.Second || h != 1<<30 {
		t.Fatalf("pitr %s, gc_horizon %d; want 90s (the environment), 1 GiB", cfg.Storage.PITR, h)
	}
}

func TestImageLayerBytes(t *testing.T) {
	cfg, err := LoadEnv("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := cfg.Storage.ImageLayerByteCount(); err != nil || n != 256<<20 {
		t.Fatalf("default image_layer_bytes %d (%v), want 256 MiB", n, err)
	}
	cfg, err = LoadEnv(writeFile(t, "storage:\n  image_layer_bytes: 1GB\n"), []string{"STRATA_STORAGE_IMAGE_LAYER_BYTES=32MiB"})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := cfg.Storage.ImageLayerByteCount(); n != 32<<20 {
		t.Fatalf("image_layer_bytes %d, want 32 MiB (the environment)", n)
	}
}

func TestMissingFile(t *testing.T) {
	_, err := LoadEnv(filepath.Join(t.TempDir(), "nope.yaml"), nil)
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Fatalf("err = %v", err)
	}
}

func TestSchemaKeysDuration(t *testing.T) {
	type inner struct {
		Every time.Duration `mapstructure:"every"`
	}
	type outer struct {
		In   inner          `mapstructure:"in"`
		Free map[string]any `mapstructure:"free"`
	}
	known, free := schemaKeys(reflectTypeOf[outer](), "")
	if !known["in.every"] || !known["free"] || len(free) != 1 || free[0] != "free." {
		t.Fatalf("known=%v free=%v", known, free)
	}
}

func TestComputeAndStorage(t *testing.T) {
	p := writeFile(t, "cluster:\n  safekeeper_port: 8000\nstorage:\n  page_source: redo\n  image_policy: pushdown\ncompute:\n  memory_budget: 1GiB\n  cache:\n    strategy: shared-buffers\n    lfc:\n      partitions: 1\n")
	cfg, err := LoadEnv(p, []string{"STRATA_COMPUTE_MEMORY_BUDGET=2GB"})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := cfg.Compute.MemoryBudgetBytes(); err != nil || b != 2<<30 {
		t.Fatalf("memory budget %d, %v", b, err)
	}
	if cfg.Compute.Cache.Strategy != "shared-buffers" || cfg.Compute.Cache.LFC.Partitions != 1 || cfg.Compute.Cache.LFC.Policy != "s3fifo" {
		t.Fatalf("cache: %+v", cfg.Compute.Cache)
	}
	if cfg.Storage.PageSource != PageSourceRedo || cfg.Storage.ImagePolicy != "pushdown" || cfg.Storage.PushdownDeltas != 16 || cfg.Storage.HotBurst != 4 || cfg.Compute.RedoStorePages != 16384 {
		t.Fatalf("storage: %+v, redo store %d pages", cfg.Storage, cfg.Compute.RedoStorePages)
	}
	// Redo needs images from WAL: not the writeback policy; fpi needs
	// full page writes.
	for _, bad := range []string{
		"storage:\n  page_source: redo\n  image_policy: writeback\n",
		"storage:\n  page_source: redo\n  image_policy: fpi\ncompute:\n  full_page_writes: false\n",
		"compute:\n  redo_store_pages: -1\n",
	} {
		if _, err := LoadEnv(writeFile(t, bad), nil); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	if got := cfg.Cluster.PageserverGRPCPort(); got != 8003 {
		t.Fatalf("pageserver port %d, want 8003 (after the three safekeepers)", got)
	}
	for in, want := range map[string]int64{"512MB": 512 << 20, "1GiB": 1 << 30, "4096": 4096, "1.5GB": 3 << 29, "64kB": 64 << 10} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "MB", "12 parsecs", "-"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}

// TestCacheAdvisor: the advisor section loads, its plugin config stays a
// free map, and the path can come from the environment.
func TestCacheAdvisor(t *testing.T) {
	p := writeFile(t, "compute:\n  cache:\n    strategy: lfc\n    advisor:\n      plugin:\n        sha256: 00ff\n        config:\n          grow_step: 0.5\n          nested: {a: 1}\n")
	cfg, err := LoadEnv(p, []string{"STRATA_COMPUTE_CACHE_ADVISOR_PLUGIN_PATH=/opt/advisor"})
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Compute.Cache.Advisor
	if !a.Enabled() || a.Plugin.Path != "/opt/advisor" || a.Plugin.SHA256 != "00ff" || a.Every != 5*time.Second || a.Plugin.Config["grow_step"] != 0.5 {
		t.Fatalf("advisor %+v", a)
	}
	if d := Default().Compute.Cache.Advisor; d.Enabled() {
		t.Fatalf("an advisor by default: %+v", d)
	}
}
