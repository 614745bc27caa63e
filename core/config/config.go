// Package config loads strata's one YAML file into typed structs: the only
// package that imports viper. Every key can be overridden by an environment
// variable (objectstore.fs.root is STRATA_OBJECTSTORE_FS_ROOT). An unknown
// key, a value of the wrong type or a missing required setting is an error
// that names the key and the file.
//
// It is not where components are built: cmd/strata reads a Config and passes
// each section to the component that owns it.
package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/stratadb/strata/plugins/cache/lfc"
	"github.com/stratadb/strata/plugins/cache/sharedbuffers"
	"github.com/stratadb/strata/plugins/objectstore/azure"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/plugins/objectstore/gcs"
	"github.com/stratadb/strata/plugins/objectstore/s3"
)

// DefaultPath is the config file a sub-command reads without --config.
const DefaultPath = "configs/local.yaml"

// Config is the whole strata configuration.
type Config struct {
	// Path is the file the config was read from ("" for defaults only).
	Path string `mapstructure:"-"`

	Cluster     Cluster     `mapstructure:"cluster"`
	Log         Log         `mapstructure:"log"`
	ObjectStore ObjectStore `mapstructure:"objectstore"`
	Storage     Storage     `mapstructure:"storage"`
	Compute     Compute     `mapstructure:"compute"`
}

// Page sources (storage.page_source).
const (
	// PageSourceWriteback: Postgres' own page writes travel through FUSE
	// to the pageserver (DESIGN.md section 2).
	PageSourceWriteback = "writeback"
	// PageSourceRedo: the pageserver rebuilds pages from WAL.
	PageSourceRedo = "redo"
)

// Storage selects how the pageserver obtains page versions.
type Storage struct {
	// PageSource is writeback (default) or redo.
	PageSource string `mapstructure:"page_source"`
	// ImagePolicy is the pageserver's image policy: writeback (default),
	// fpi, pushdown or hot.
	ImagePolicy string `mapstructure:"image_policy"`
	// PushdownDeltas: pushdown and hot materialize a page after this many
	// deltas since its last image (default 16).
	PushdownDeltas int `mapstructure:"pushdown_deltas"`
	// PushdownBytes: ... or after this many bytes of deltas (0: no limit).
	PushdownBytes int `mapstructure:"pushdown_bytes"`
	// HotBurst: hot also materializes at once a page with this many deltas
	// in one ingest batch (default 4).
	HotBurst int `mapstructure:"hot_burst"`
	// PITR is how long the pageserver keeps page history (default 1h):
	// reads, branches and basebackups at an older LSN are refused, and GC
	// deletes layer files only below it. Space a dropped table or
	// database held comes back once it is older than this.
	PITR time.Duration `mapstructure:"pitr"`
	// GCHorizon: ... and at least this much WAL of history behind the last
	// record ("64MiB", "1GB" or bytes; default 64MiB).
	GCHorizon string `mapstructure:"gc_horizon"`
	// ImageLayerBytes: the writeback and fpi policies (and pushdown's and
	// hot's layer rule) write image layers of the key ranges that changed
	// after this many bytes of delta layers, and never before the deltas
	// reach the size of the images they replace ("256MiB", "1GB" or bytes;
	// default 256MiB). Smaller: shorter delta chains and earlier GC, more image
	// bytes written.
	ImageLayerBytes string `mapstructure:"image_layer_bytes"`
}

// GCHorizonBytes parses GCHorizon.
func (s Storage) GCHorizonBytes() (int64, error) { return ParseBytes(s.GCHorizon) }

// IngestsWAL says whether the pageserver follows the safekeepers' WAL:
// every image policy but writeback (redo mode always) rebuilds or stores
// pages from it.
func (s Storage) IngestsWAL() bool { return s.ImagePolicy != "writeback" }

// ImageLayerByteCount parses ImageLayerBytes.
func (s Storage) ImageLayerByteCount() (int64, error) { return ParseBytes(s.ImageLayerBytes) }

// Validate checks the storage section.
func (s *Storage) Validate() error {
	switch s.PageSource {
	case PageSourceWriteback, PageSourceRedo:
	default:
		return fmt.Errorf("storage.page_source: %q: want writeback or redo", s.PageSource)
	}
	switch s.ImagePolicy {
	case "writeback", "fpi", "pushdown", "hot":
	default:
		return fmt.Errorf("storage.image_policy: %q: want writeback, fpi, pushdown or hot", s.ImagePolicy)
	}
	if s.PageSource == PageSourceRedo && s.ImagePolicy == "writeback" {
		return fmt.Errorf("storage.image_policy: writeback with page_source redo: redo rebuilds pages from WAL, choose pushdown or hot (with full_page_writes off) or fpi")
	}
	if s.PushdownDeltas <= 0 {
		return fmt.Errorf("storage.pushdown_deltas: %d: must be positive", s.PushdownDeltas)
	}
	if s.PushdownBytes < 0 {
		return fmt.Errorf("storage.pushdown_bytes: %d: must be 0 (no limit) or positive", s.PushdownBytes)
	}
	if s.HotBurst <= 0 {
		return fmt.Errorf("storage.hot_burst: %d: must be positive", s.HotBurst)
	}
	if s.PITR < 0 {
		return fmt.Errorf("storage.pitr: %s: must be 0 or positive", s.PITR)
	}
	if _, err := s.GCHorizonBytes(); err != nil {
		return fmt.Errorf("storage.gc_horizon: %w", err)
	}
	if n, err := s.ImageLayerByteCount(); err != nil {
		return fmt.Errorf("storage.image_layer_bytes: %w", err)
	} else if n < 1<<20 {
		return fmt.Errorf("storage.image_layer_bytes: %s: must be at least 1MiB (each image pass rewrites whole key ranges of the database)", s.ImageLayerBytes)
	}
	return nil
}

// Cluster holds settings shared by every process of one cluster.
type Cluster struct {
	// DataDir is the folder under which the processes of `strata up` keep
	// their local state (default ./.strata).
	DataDir string `mapstructure:"data_dir"`
	// Safekeepers is how many safekeepers `strata up` starts (default 3).
	Safekeepers int `mapstructure:"safekeepers"`
	// Quorum is how many safekeepers must hold WAL before Postgres
	// acknowledges a commit (default 2: synchronous_standby_names =
	// 'ANY 2 (sk1, sk2, sk3)').
	Quorum int `mapstructure:"quorum"`
	// SafekeeperPort is the gRPC port of the first safekeeper; the others
	// take the next ones (default 7676).
	SafekeeperPort int `mapstructure:"safekeeper_port"`
	// MetricsPort is the first of the /metrics ports of the processes
	// `strata up` starts (default 9676; 0 turns them off): the
	// safekeepers', then the pageserver's, then the compute agent's.
	MetricsPort int `mapstructure:"metrics_port"`
	// PageserverPort is the pageserver's gRPC port (default 0: the port
	// after the safekeepers', safekeeper_port + safekeepers).
	PageserverPort int `mapstructure:"pageserver_port"`
	// SafekeeperGOMAXPROCS is the Go scheduler's processor count of each
	// safekeeper `strata up` starts (`strata safekeeper --gomaxprocs`;
	// default 1, 0: Go's default, one per core). A safekeeper spends its
	// time in system calls; with one processor its goroutines hand work to
	// each other on one thread instead of waking idle threads on other
	// cores, which on a machine shared with Postgres cost 15% of its CPU
	// (docs/benchmarks.md, Safekeepers).
	SafekeeperGOMAXPROCS int `mapstructure:"safekeeper_gomaxprocs"`
	// SafekeeperRawSyscalls makes the safekeepers' WAL path (the
	// replication socket, the WAL writes and flushes) use raw system
	// calls, which skip the Go runtime's system-call bookkeeping
	// (`strata safekeeper --raw-syscalls`; default true). With false they
	// make the usual calls: about 30% more CPU per transaction
	// (docs/benchmarks.md, Safekeepers).
	SafekeeperRawSyscalls bool `mapstructure:"safekeeper_raw_syscalls"`
	// SafekeeperWALRetain is how much archived WAL each safekeeper keeps
	// on its disk with image policy writeback, where no pageserver
	// ingests WAL and so none says what it may remove (`strata safekeeper
	// --archive-retain`; default 1GiB; 0 keeps all of it). Older WAL is
	// read from the archive (a compute that starts from an old
	// checkpoint). With a policy that ingests WAL (fpi, pushdown, hot, and
	// redo mode), WAL below what the pageserver made durable is removed
	// instead.
	SafekeeperWALRetain string `mapstructure:"safekeeper_wal_retain"`
}

// SafekeeperWALRetainBytes parses SafekeeperWALRetain.
func (c Cluster) SafekeeperWALRetainBytes() (int64, error) { return ParseBytes(c.SafekeeperWALRetain) }

// PageserverGRPCPort returns the pageserver's port (PageserverPort, or the
// one after the safekeepers').
func (c Cluster) PageserverGRPCPort() int {
	if c.PageserverPort > 0 {
		return c.PageserverPort
	}
	return c.SafekeeperPort + c.Safekeepers
}

// Compute is the Postgres that strata runs.
type Compute struct {
	// Port is Postgres' TCP port on 127.0.0.1 (default 25432).
	Port int `mapstructure:"port"`
	// OSUser is the unprivileged OS user Postgres runs as when strata runs
	// as root (default postgres).
	OSUser string `mapstructure:"os_user"`
	// PGBinDir holds the PostgreSQL 15 programs.
	PGBinDir string `mapstructure:"pg_bin_dir"`
	// FullPageWrites sets full_page_writes (default true).
	FullPageWrites bool `mapstructure:"full_page_writes"`
	// SharedBuffers, when set, overrides the shared_buffers that the memory
	// plan computes, in Postgres' units ("128MB"); an A/B of cache
	// strategies should leave it empty.
	SharedBuffers string `mapstructure:"shared_buffers"`
	// MemoryBudget is the compute's memory ("1GB", "512MiB" or bytes),
	// split between shared_buffers and the LFC by Cache.Strategy.
	MemoryBudget string `mapstructure:"memory_budget"`
	// Cache selects the cache strategy and configures the tiers.
	Cache ComputeCache `mapstructure:"cache"`
	// Settings are extra postgresql.conf settings, written as given
	// (quote strings yourself: "'on'" is not needed for on).
	Settings map[string]string `mapstructure:"settings"`
	// RedoStorePages bounds the compute's local page store in redo mode
	// (storage.page_source: redo), in 8 KiB pages (default 16384: 128
	// MiB, outside memory_budget). Pages it evicts are read back from the
	// pageserver, rebuilt from WAL.
	RedoStorePages int `mapstructure:"redo_store_pages"`
	// ReadAhead is how many blocks of a relation fork the compute fetches
	// in one batch ahead of a process that reads it sequentially (a
	// sequential scan, VACUUM, an index build, pg_dump), so that pages in
	// no cache tier cost one round trip to the pageserver per batch rather
	// than per 8 KiB block. Default 64 (512 KiB); 0 turns it off; at most
	// 1024.
	ReadAhead int `mapstructure:"read_ahead"`
	// PGWal says where pg_wal lives. It is scratch either way (the
	// safekeepers make WAL durable and every start refills it):
	//   tmpfs: a symbolic link out of the mount to a folder in /dev/shm,
	//          so WAL writes, Postgres' WAL fsyncs and the walsenders'
	//          reads cost no FUSE round trip and no disk flush; takes up
	//          to max_wal_size (1 GB by default) of memory.
	//   disk:  the same link, to the compute's scratch folder on disk
	//          (Postgres' WAL fsyncs then flush that disk).
	//   fuse:  a folder of the FUSE mount passing through to scratch
	//          (every WAL write, fsync and walsender read crosses FUSE).
	//   auto:  tmpfs when /dev/shm is a tmpfs with room, else disk (default).
	PGWal string `mapstructure:"pg_wal"`
}

// compute.pg_wal values.
const (
	PGWalAuto  = "auto"
	PGWalTmpfs = "tmpfs"
	PGWalDisk  = "disk"
	PGWalFUSE  = "fuse"
)

// ComputeCache is compute.cache.
type ComputeCache struct {
	// Strategy is lfc (a small shared_buffers in front of the local file
	// cache) or shared-buffers (no LFC, Postgres' buffer pool gets the
	// share of the memory budget).
	Strategy      string               `mapstructure:"strategy"`
	LFC           lfc.Config           `mapstructure:"lfc"`
	SharedBuffers sharedbuffers.Config `mapstructure:"shared_buffers"`
	// Prewarm warms the cache after every start, so that a restarted
	// compute, or a new one on an empty machine, does not begin cold. lfc:
	// the agent saves the list of the pages its LFC holds in the object
	// store every PrewarmInterval and when it stops, and reads those pages
	// into the LFC after a start. shared-buffers: Postgres' autoprewarm
	// (pg_prewarm), whose block list is a file of the data directory.
	Prewarm         bool          `mapstructure:"prewarm"`
	PrewarmInterval time.Duration `mapstructure:"prewarm_interval"`
	// Advisor is an external cache advisor plugin (sdk/cache.Advisor over
	// go-plugin) that resizes the LFC once a period; lfc strategy only.
	Advisor CacheAdvisor `mapstructure:"advisor"`
}

// CacheAdvisor is compute.cache.advisor. An empty plugin path: no advisor.
type CacheAdvisor struct {
	// Plugin is the advisor binary; its config section is passed to it as
	// JSON.
	Plugin ExternalPlugin `mapstructure:"plugin"`
	// Every is the period between two calls (default 5s).
	Every time.Duration `mapstructure:"every"`
}

// Enabled says whether an advisor plugin is configured.
func (a CacheAdvisor) Enabled() bool { return a.Plugin.Path != "" }

// MemoryBudgetBytes parses Compute.MemoryBudget.
func (c Compute) MemoryBudgetBytes() (int64, error) { return ParseBytes(c.MemoryBudget) }

// ParseBytes parses a size: a number of bytes, or a number with a unit
// kB/KB/KiB, MB/MiB, GB/GiB, TB/TiB (powers of 1024, as Postgres reads them).
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	var f float64
	if _, err := fmt.Sscanf(num, "%g", &f); err != nil || num == "" {
		return 0, fmt.Errorf("%q: not a size (want e.g. 512MB or 1GiB)", s)
	}
	mult := map[string]float64{"": 1, "b": 1, "kb": 1 << 10, "kib": 1 << 10, "k": 1 << 10,
		"mb": 1 << 20, "mib": 1 << 20, "m": 1 << 20, "gb": 1 << 30, "gib": 1 << 30, "g": 1 << 30,
		"tb": 1 << 40, "tib": 1 << 40, "t": 1 << 40}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("%q: unknown unit %q (want kB, MB, GB or TB)", s, unit)
	}
	return int64(f * mult), nil
}

// Validate checks the compute's memory budget and cache tiers.
func (c Compute) Validate() error {
	var errs []error
	budget, err := c.MemoryBudgetBytes()
	if err != nil {
		errs = append(errs, fmt.Errorf("compute.memory_budget: %v", err))
	}
	switch c.PGWal {
	case PGWalAuto, PGWalTmpfs, PGWalDisk, PGWalFUSE:
	default:
		errs = append(errs, fmt.Errorf("compute.pg_wal: %q: want auto, tmpfs, disk or fuse", c.PGWal))
	}
	switch c.Cache.Strategy {
	case sharedbuffers.StrategyLFC, sharedbuffers.StrategySharedBuffers:
	default:
		errs = append(errs, fmt.Errorf("compute.cache.strategy: %q: want lfc or shared-buffers", c.Cache.Strategy))
	}
	if err := c.Cache.SharedBuffers.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("compute.cache.%v", err))
	}
	if c.Cache.PrewarmInterval < time.Second {
		errs = append(errs, fmt.Errorf("compute.cache.prewarm_interval: %s: want at least 1s", c.Cache.PrewarmInterval))
	}
	if adv := c.Cache.Advisor; adv.Enabled() {
		if c.Cache.Strategy != sharedbuffers.StrategyLFC {
			errs = append(errs, fmt.Errorf("compute.cache.advisor: an advisor sizes the LFC: it needs compute.cache.strategy lfc, not %q", c.Cache.Strategy))
		}
		if adv.Every < 100*time.Millisecond {
			errs = append(errs, fmt.Errorf("compute.cache.advisor.every: %s: want at least 100ms", adv.Every))
		}
	} else if len(c.Cache.Advisor.Plugin.Args) > 0 || c.Cache.Advisor.Plugin.SHA256 != "" || len(c.Cache.Advisor.Plugin.Config) > 0 {
		errs = append(errs, errors.New("compute.cache.advisor.plugin: settings without a path (set plugin.path, or remove the section)"))
	}
	l := c.Cache.LFC
	if l.Tier == lfc.TierDisk && l.Path == "" {
		l.Path = "scratch" // the agent puts the file in its scratch folder
	}
	if err := l.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("compute.cache.%v", err))
	}
	if len(errs) == 0 {
		if _, err := (sharedbuffers.Planner{}).Plan(budget, c.Cache.Strategy, c.Cache.SharedBuffers); err != nil {
			errs = append(errs, fmt.Errorf("compute.memory_budget: %v", err))
		}
	}
	return joinErrs(errs)
}

// Log selects the level and format of every process's log.
type Log struct {
	Level  string `mapstructure:"level"`  // debug | info | warn | error
	Format string `mapstructure:"format"` // auto | json | console
}

// Object store plugin modes.
const (
	ModeBuiltin  = "builtin"
	ModeExternal = "external"
)

// ObjectStore selects the object store plugin and holds each builtin
// plugin's own section; only the section named by Type is used.
type ObjectStore struct {
	// Type names the plugin: fs, s3, gcs, azure, or the name of an external
	// plugin.
	Type string `mapstructure:"type"`
	// Mode is builtin (linked into strata) or external (its own process,
	// launched from Plugin.Path).
	Mode string `mapstructure:"mode"`
	// Plugin describes the external plugin binary (Mode external only).
	Plugin ExternalPlugin `mapstructure:"plugin"`
	// StallTimeout ends a call to a cloud store (every type but fs) that
	// makes no progress for this long, as a transient failure that is
	// retried (objectstore.WithStallTimeout): a store that stops answering
	// without closing its connections would otherwise hold the call for
	// many minutes. 0 turns it off.
	StallTimeout time.Duration `mapstructure:"stall_timeout"`

	FS    fs.Config    `mapstructure:"fs"`
	S3    s3.Config    `mapstructure:"s3"`
	GCS   gcs.Config   `mapstructure:"gcs"`
	Azure azure.Config `mapstructure:"azure"`
}

// ExternalPlugin is how to launch and trust an external plugin binary.
type ExternalPlugin struct {
	// Path is the plugin executable.
	Path string `mapstructure:"path"`
	// Args are passed to the executable.
	Args []string `mapstructure:"args"`
	// SHA256 is the hex SHA-256 of the executable; when set, a binary that
	// does not match is refused.
	SHA256 string `mapstructure:"sha256"`
	// Config is the settings of a plugin that strata does not know (a
	// third-party plugin); it is passed to the plugin as JSON. For the
	// builtin types the plugin gets their section (fs, s3, ...) instead.
	Config map[string]any `mapstructure:"config"`
}

// Builtin object store types.
var ObjectStoreTypes = []string{"fs", "s3", "gcs", "azure"}

// Default returns the configuration that applies where the file is silent:
// the embedded single-machine cluster under ./.strata.
func Default() Config {
	return Config{
		Cluster: Cluster{DataDir: ".strata", Safekeepers: 3, Quorum: 2, SafekeeperPort: 7676, MetricsPort: 9676, SafekeeperGOMAXPROCS: 1, SafekeeperRawSyscalls: true, SafekeeperWALRetain: "1GiB"},
		Compute: Compute{
			Port:           25432,
			OSUser:         "postgres",
			PGBinDir:       "/usr/lib/postgresql/15/bin",
			FullPageWrites: true,
			MemoryBudget:   "512MB",
			RedoStorePages: 16384,
			ReadAhead:      64,
			PGWal:          PGWalAuto,
			Cache: ComputeCache{
				Advisor:       CacheAdvisor{Every: 5 * time.Second},
				Strategy:      sharedbuffers.StrategySharedBuffers,
				LFC:           lfc.DefaultConfig(),
				SharedBuffers: sharedbuffers.DefaultConfig(),
				Prewarm:       true, PrewarmInterval: 5 * time.Minute,
			},
		},
		Storage: Storage{PageSource: PageSourceWriteback, ImagePolicy: "writeback", PushdownDeltas: 16, HotBurst: 4,
			PITR: time.Hour, GCHorizon: "64MiB", ImageLayerBytes: "256MiB"},
		Log: Log{Level: "info", Format: "auto"},
		ObjectStore: ObjectStore{
			Type:         "fs",
			Mode:         ModeBuiltin,
			StallTimeout: 2 * time.Minute,
			FS:           fs.Config{Root: filepath.Join(".strata", "objects")},
		},
	}
}

// Load reads the file at path over the defaults, applies STRATA_*
// environment overrides and validates the result. path "" means defaults
// and environment only.
func Load(path string) (*Config, error) {
	return LoadEnv(path, os.Environ())
}

// LoadEnv is Load with an explicit environment (KEY=VALUE strings).
func LoadEnv(path string, env []string) (*Config, error) {
	cfg := Default()
	if err := decodeFile(path, env, &cfg); err != nil {
		return nil, err
	}
	cfg.Path = path
	if err := cfg.Validate(); err != nil {
		where := path
		if where == "" {
			where = "defaults"
		}
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, where, err)
	}
	return &cfg, nil
}

// Validate checks every section; the error names the first bad key.
func (c *Config) Validate() error {
	var errs []error
	if c.Cluster.DataDir == "" {
		errs = append(errs, errors.New("cluster.data_dir: required"))
	}
	if n, err := c.Cluster.SafekeeperWALRetainBytes(); err != nil {
		errs = append(errs, fmt.Errorf("cluster.safekeeper_wal_retain: %v", err))
	} else if n < 0 {
		errs = append(errs, fmt.Errorf("cluster.safekeeper_wal_retain: %q: want 0 or more", c.Cluster.SafekeeperWALRetain))
	}
	if c.Cluster.SafekeeperGOMAXPROCS < 0 {
		errs = append(errs, fmt.Errorf("cluster.safekeeper_gomaxprocs: %d: want 0 (Go's default) or more", c.Cluster.SafekeeperGOMAXPROCS))
	}
	if c.Cluster.Safekeepers < 1 || c.Cluster.Safekeepers > 9 {
		errs = append(errs, fmt.Errorf("cluster.safekeepers: %d: want 1 to 9", c.Cluster.Safekeepers))
	} else if c.Cluster.Quorum < 1 || c.Cluster.Quorum > c.Cluster.Safekeepers {
		errs = append(errs, fmt.Errorf("cluster.quorum: %d: want 1 to cluster.safekeepers (%d)", c.Cluster.Quorum, c.Cluster.Safekeepers))
	} else if c.Cluster.Safekeepers >= 2 && 2*c.Cluster.Quorum <= c.Cluster.Safekeepers {
		errs = append(errs, fmt.Errorf("cluster.quorum: %d of %d is not a majority: two computes could each commit on a different minority", c.Cluster.Quorum, c.Cluster.Safekeepers))
	}
	for key, p := range map[string]int{"cluster.safekeeper_port": c.Cluster.SafekeeperPort, "compute.port": c.Compute.Port, "cluster.pageserver_port": c.Cluster.PageserverGRPCPort()} {
		if p < 1 || p > 65535 {
			errs = append(errs, fmt.Errorf("%s: %d: want 1 to 65535", key, p))
		}
	}
	if c.Cluster.MetricsPort < 0 || c.Cluster.MetricsPort > 65535 {
		errs = append(errs, fmt.Errorf("cluster.metrics_port: %d: want 0 (off) to 65535", c.Cluster.MetricsPort))
	}
	if c.Compute.OSUser == "" {
		errs = append(errs, errors.New("compute.os_user: required"))
	}
	if c.Compute.PGBinDir == "" {
		errs = append(errs, errors.New("compute.pg_bin_dir: required"))
	}
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log.level: %q: want debug, info, warn or error", c.Log.Level))
	}
	switch c.Log.Format {
	case "auto", "json", "console":
	default:
		errs = append(errs, fmt.Errorf("log.format: %q: want auto, json or console", c.Log.Format))
	}
	if err := c.ObjectStore.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Storage.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Compute.Validate(); err != nil {
		errs = append(errs, err)
	}
	if c.Storage.PageSource == PageSourceRedo && c.Storage.ImagePolicy == "fpi" && !c.Compute.FullPageWrites {
		errs = append(errs, errors.New("storage.image_policy: fpi takes images only from full page images in the WAL: set compute.full_page_writes: true, or use pushdown"))
	}
	if c.Compute.ReadAhead < 0 || c.Compute.ReadAhead > 1024 {
		errs = append(errs, fmt.Errorf("compute.read_ahead: %d: want 0 (off) to 1024 blocks", c.Compute.ReadAhead))
	}
	if c.Compute.RedoStorePages < 0 {
		errs = append(errs, fmt.Errorf("compute.redo_store_pages: %d: want 0 or more", c.Compute.RedoStorePages))
	}
	return joinErrs(errs)
}

// Validate checks the object store selection and the chosen plugin's section.
func (o *ObjectStore) Validate() error {
	if o.Type == "" {
		return errors.New("objectstore.type: required (fs, s3, gcs or azure)")
	}
	builtin := false
	for _, t := range ObjectStoreTypes {
		builtin = builtin || t == o.Type
	}
	switch o.Mode {
	case ModeBuiltin:
		if !builtin {
			return fmt.Errorf("objectstore.type: %q is not a builtin store (%s); set objectstore.mode: external and objectstore.plugin.path for a third-party plugin", o.Type, strings.Join(ObjectStoreTypes, ", "))
		}
	case ModeExternal:
		if o.Plugin.Path == "" {
			return errors.New("objectstore.plugin.path: required when objectstore.mode is external")
		}
	default:
		return fmt.Errorf("objectstore.mode: %q: want builtin or external", o.Mode)
	}
	if o.StallTimeout < 0 {
		return fmt.Errorf("objectstore.stall_timeout: %s: want a duration of 0 (off) or more", o.StallTimeout)
	}
	if err := o.sectionValidate(); err != nil {
		return fmt.Errorf("objectstore.%w", err)
	}
	return nil
}

func (o *ObjectStore) sectionValidate() error {
	switch o.Type {
	case "fs":
		return o.FS.Validate()
	case "s3":
		return o.S3.Validate()
	case "gcs":
		return o.GCS.Validate()
	case "azure":
		return o.Azure.Validate()
	}
	return nil
}

// Section returns the chosen plugin's settings, to be passed to an external
// plugin as JSON: the builtin type's section, or Plugin.Config for others.
func (o *ObjectStore) Section() any {
	switch o.Type {
	case "fs":
		return o.FS
	case "s3":
		return o.S3
	case "gcs":
		return o.GCS
	case "azure":
		return o.Azure
	}
	return o.Plugin.Config
}

// joinErrs joins errors on one line, so that a bad config prints as one.
func joinErrs(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	msgs := make([]string, len(errs))
	for i, e := range errs {
		msgs[i] = e.Error()
	}
	return errors.New(strings.Join(msgs, "; "))
}
