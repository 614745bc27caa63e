package safekeeper

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Config is a safekeeper's configuration: the flags of `strata
// safekeeper` (BindFlags); the config file has no safekeeper section.
type Config struct {
	// ID names the safekeeper. It is the application_name it streams under,
	// so synchronous_standby_names must list it (e.g. 'ANY 2 (sk1, sk2, sk3)').
	ID string `mapstructure:"id"`
	// DataDir holds the control file, pg_wal/ (segments named as in
	// Postgres) and crc/ (per-block checksums).
	DataDir string `mapstructure:"data_dir"`
	// ListenAddr is the gRPC address of the WAL service and the election API
	// ("" disables it).
	ListenAddr string `mapstructure:"listen_addr"`
	// MetricsAddr serves Prometheus /metrics ("" disables it).
	MetricsAddr string `mapstructure:"metrics_addr"`
	// Postgres is the connection string of the compute's Postgres, as a
	// replication user with a password. The compute agent replaces it per
	// term through the election API; this value is the bootstrap target.
	Postgres string `mapstructure:"postgres"`
	// Slot is the physical replication slot name (default "strata_<id>").
	Slot string `mapstructure:"slot"`
	// Peers are the gRPC addresses of the other safekeepers.
	Peers []string `mapstructure:"peers"`
	// StatusInterval bounds the time between standby status updates.
	StatusInterval time.Duration `mapstructure:"status_interval"`
	// ReconnectDelay is the pause before reconnecting to Postgres.
	ReconnectDelay time.Duration `mapstructure:"reconnect_delay"`
	// ControlSyncInterval is how often the control file records the flush
	// and commit LSNs.
	ControlSyncInterval time.Duration `mapstructure:"control_sync_interval"`
	// VerifyOnStart checks every stored block's checksum at start.
	VerifyOnStart bool `mapstructure:"verify_on_start"`
	// RawSyscalls makes the WAL path's system calls (the replication
	// socket, the WAL writes and flushes) raw: they skip the Go runtime's
	// system-call bookkeeping, which cost about a quarter of a
	// safekeeper's CPU. A flush that takes longer than 100 ms sends the
	// next 10 s of calls the usual way, so that a stalled disk does not
	// hold up the rest of the process (internal/rawio). Default true.
	RawSyscalls bool `mapstructure:"raw_syscalls"`
	// Archive configures uploads of WAL segments to the object store.
	Archive ArchiveConfig `mapstructure:"archive"`
}

// ArchiveConfig configures WAL archiving.
type ArchiveConfig struct {
	// Enabled turns archiving on (the object store comes from the
	// objectstore section of the configuration).
	Enabled bool `mapstructure:"enabled"`
	// Prefix is the key prefix of archived segments.
	Prefix string `mapstructure:"prefix"`
	// PartialAfter uploads the partial last segment after this much quiet
	// time (0 disables partial uploads).
	PartialAfter time.Duration `mapstructure:"partial_after"`
	// PartialEvery also uploads it this often while commits go on (the
	// segment's owner in the group, another member when the owner's copy
	// stops growing; 0: only after quiet). A restore from
	// the object store alone after every safekeeper disk is lost (one
	// machine's) misses at most this much of the newest WAL.
	PartialEvery time.Duration `mapstructure:"partial_every"`
	// Interval is how often the archiver looks for work.
	Interval time.Duration `mapstructure:"interval"`
	// KeepLocal keeps local segments even when archived and consumed.
	KeepLocal bool `mapstructure:"keep_local"`
	// Retain, for a group no consumer streams WAL from (a writeback-mode
	// pageserver ingests none): archived WAL more than this many bytes
	// below the flush LSN is removed without waiting for a consumer (a
	// starting compute reads older WAL from the archive). 0 (the default):
	// nothing is removed until a consumer reports.
	Retain uint64 `mapstructure:"retain"`
	// ConsumerExpiry forgets a WAL consumer (a pageserver that ingests
	// WAL) that stays behind the commit LSN without progress this long: a
	// pageserver whose timeline was abandoned, or that went away for good,
	// would otherwise keep every later WAL byte on the safekeepers' disks.
	// Should it return, the WAL it needs that is gone from the disks is
	// streamed from the archive. 0: never (default 1 h).
	ConsumerExpiry time.Duration `mapstructure:"consumer_expiry"`
	// Takeover: each segment has one uploader in the group (its owner);
	// another member uploads it when it is still missing this long after
	// it could have (default 30 s).
	Takeover time.Duration `mapstructure:"takeover"`
}

// DefaultConfig returns the defaults of a single safekeeper "sk1".
func DefaultConfig() Config {
	return Config{
		ID:                  "sk1",
		DataDir:             "data/safekeeper/sk1",
		ListenAddr:          "127.0.0.1:7676",
		StatusInterval:      time.Second,
		ReconnectDelay:      500 * time.Millisecond,
		ControlSyncInterval: time.Second,
		VerifyOnStart:       true,
		RawSyscalls:         true,
		Archive: ArchiveConfig{
			Prefix:         "wal",
			PartialAfter:   10 * time.Second,
			PartialEvery:   time.Minute,
			Interval:       time.Second,
			Takeover:       30 * time.Second,
			ConsumerExpiry: time.Hour,
		},
	}
}

var idRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Validate reports configuration errors.
func (c *Config) Validate() error {
	var errs []error
	if !idRE.MatchString(c.ID) {
		errs = append(errs, fmt.Errorf("id %q: want lower-case letters, digits and _ (a Postgres name)", c.ID))
	}
	if c.Slot != "" && !idRE.MatchString(c.Slot) {
		errs = append(errs, fmt.Errorf("slot %q: want lower-case letters, digits and _", c.Slot))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("data_dir is required"))
	}
	if c.StatusInterval <= 0 || c.ReconnectDelay <= 0 || c.ControlSyncInterval <= 0 {
		errs = append(errs, errors.New("status_interval, reconnect_delay and control_sync_interval must be positive"))
	}
	if c.Archive.Enabled && c.Archive.Interval <= 0 {
		errs = append(errs, errors.New("archive.interval must be positive"))
	}
	if c.Archive.ConsumerExpiry < 0 {
		errs = append(errs, fmt.Errorf("archive.consumer_expiry %s: want 0 (never) or a positive duration", c.Archive.ConsumerExpiry))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("safekeeper: config: %w", err)
	}
	return nil
}

// SlotPrefix begins the default slot name of every safekeeper
// (strata_<id>). The compute agent treats slots with this prefix as the
// safekeepers' own (their fsyncs do not wait for the quorum).
const SlotPrefix = "strata_"

// SlotName returns the replication slot name.
func (c *Config) SlotName() string {
	if c.Slot != "" {
		return c.Slot
	}
	return SlotPrefix + c.ID
}
