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
	Compute     Compute     `mapstructure:"compute"`
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
	// `strata up` starts (default 9676; 0 turns them off).
	MetricsPort int `mapstructure:"metrics_port"`
}

// Compute is the Postgres that strata runs.
type Compute struct {
	// Port is Postgres' TCP port on 127.0.0.1 (default 55432).
	Port int `mapstructure:"port"`
	// OSUser is the unprivileged OS user Postgres runs as when strata runs
	// as root (default postgres).
	OSUser string `mapstructure:"os_user"`
	// PGBinDir holds the PostgreSQL 15 programs.
	PGBinDir string `mapstructure:"pg_bin_dir"`
	// FullPageWrites sets full_page_writes (default true).
	FullPageWrites bool `mapstructure:"full_page_writes"`
	// SharedBuffers sets shared_buffers, in Postgres' units ("128MB").
	SharedBuffers string `mapstructure:"shared_buffers"`
	// Settings are extra postgresql.conf settings, written as given
	// (quote strings yourself: "'on'" is not needed for on).
	Settings map[string]string `mapstructure:"settings"`
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
		Cluster: Cluster{DataDir: ".strata", Safekeepers: 3, Quorum: 2, SafekeeperPort: 7676, MetricsPort: 9676},
		Compute: Compute{
			Port:           55432,
			OSUser:         "postgres",
			PGBinDir:       "/usr/lib/postgresql/15/bin",
			FullPageWrites: true,
			SharedBuffers:  "128MB",
		},
		Log: Log{Level: "info", Format: "auto"},
		ObjectStore: ObjectStore{
			Type: "fs",
			Mode: ModeBuiltin,
			FS:   fs.Config{Root: filepath.Join(".strata", "objects")},
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
	if c.Cluster.Safekeepers < 1 || c.Cluster.Safekeepers > 9 {
		errs = append(errs, fmt.Errorf("cluster.safekeepers: %d: want 1 to 9", c.Cluster.Safekeepers))
	} else if c.Cluster.Quorum < 1 || c.Cluster.Quorum > c.Cluster.Safekeepers {
		errs = append(errs, fmt.Errorf("cluster.quorum: %d: want 1 to cluster.safekeepers (%d)", c.Cluster.Quorum, c.Cluster.Safekeepers))
	} else if c.Cluster.Safekeepers >= 2 && 2*c.Cluster.Quorum <= c.Cluster.Safekeepers {
		errs = append(errs, fmt.Errorf("cluster.quorum: %d of %d is not a majority: two computes could each commit on a different minority", c.Cluster.Quorum, c.Cluster.Safekeepers))
	}
	for key, p := range map[string]int{"cluster.safekeeper_port": c.Cluster.SafekeeperPort, "compute.port": c.Compute.Port} {
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
