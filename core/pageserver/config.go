// Package pageserver is the page half of strata's storage: it assembles the
// timeline engines (core/pageserver/timeline) of every timeline on a data
// directory, connects them to the object store, and manages timelines
// (create, branch, list). The gRPC API is in core/pageserver/server, the
// client the compute uses in core/pageserver/client.
//
// It does not talk to the safekeepers itself: core/pageserver/sklink binds a
// timeline to a safekeeper group (the commit LSN of the writeback
// durability gate, a CommitLSNSource given through Deps.Commit, and WAL
// ingest for the fpi and pushdown policies). It does fence computes:
// BeginTerm drops a dead compute's pending versions and Mutate refuses
// writes of older terms; Incarnation tells a compute that the process
// restarted and forgot pending versions.
package pageserver

import (
	"errors"
	"fmt"
	"time"

	"github.com/stratadb/strata/core/pageserver/timeline"
)

// Config is the pageserver's configuration (YAML key `pageserver:`).
type Config struct {
	// ListenAddr is the gRPC address.
	ListenAddr string `mapstructure:"listen_addr"`
	// MetricsAddr serves /metrics over HTTP ("" disables).
	MetricsAddr string `mapstructure:"metrics_addr"`
	// DataDir holds timelines/<id>/ (layer files, logs, manifests).
	DataDir string `mapstructure:"data_dir"`
	// ImagePolicy: writeback | fpi | pushdown | hot.
	ImagePolicy string `mapstructure:"image_policy"`
	// PushdownDeltas: with image_policy pushdown or hot, materialize a page
	// after N deltas since its last image.
	PushdownDeltas int `mapstructure:"pushdown_deltas"`
	// PushdownBytes: ... or after this many bytes of deltas (0: no limit).
	PushdownBytes int `mapstructure:"pushdown_bytes"`
	// HotBurst: with image_policy hot, a page with this many deltas in one
	// ingest batch (write-hot) is materialized at once.
	HotBurst int `mapstructure:"hot_burst"`
	// ImageLayerBytes: run an image pass (over the key ranges that changed)
	// after this many delta bytes.
	ImageLayerBytes int64 `mapstructure:"image_layer_bytes"`
	// CheckpointDistance: freeze the in-memory layer at this many bytes.
	CheckpointDistance int64 `mapstructure:"checkpoint_distance"`
	// CheckpointTimeout: ... or at this age.
	CheckpointTimeout time.Duration `mapstructure:"checkpoint_timeout"`
	// LayerTargetSize: target size of layer files.
	LayerTargetSize int64 `mapstructure:"layer_target_size"`
	// CompactionThreshold: compact when this many L0 layers exist.
	CompactionThreshold int `mapstructure:"compaction_threshold"`
	// GCHorizon: keep this many bytes of WAL history.
	GCHorizon uint64 `mapstructure:"gc_horizon"`
	// PITR: and this much time.
	PITR time.Duration `mapstructure:"pitr"`
	// WaitLSNTimeout bounds GetPage waits for WAL.
	WaitLSNTimeout time.Duration `mapstructure:"wait_lsn_timeout"`
	// CacheBytes bounds the materialized page cache per timeline.
	CacheBytes int64 `mapstructure:"cache_bytes"`
	// MaxLocalBytes bounds local layer files per timeline (0: unbounded).
	MaxLocalBytes int64 `mapstructure:"max_local_bytes"`
	// UploadParallelism bounds concurrent layer uploads.
	UploadParallelism int `mapstructure:"upload_parallelism"`
	// BackgroundInterval is the period of each timeline's flush, commit, GC
	// and eviction loop; 0 takes the timeline default (a second). Not a YAML
	// key: tests set it to tell what releases a write apart from the tick.
	BackgroundInterval time.Duration `mapstructure:"-"`
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	o := timeline.DefaultOptions()
	return Config{
		ListenAddr:          "127.0.0.1:7679", // where strata up puts it, and strata compute looks
		MetricsAddr:         "127.0.0.1:9679",
		DataDir:             "data/pageserver",
		ImagePolicy:         "writeback",
		PushdownDeltas:      16,
		HotBurst:            4,
		ImageLayerBytes:     256 << 20,
		CheckpointDistance:  o.CheckpointDistance,
		CheckpointTimeout:   o.CheckpointTimeout,
		LayerTargetSize:     o.LayerTargetSize,
		CompactionThreshold: o.CompactionThreshold,
		GCHorizon:           o.GCHorizon,
		PITR:                o.PITR,
		WaitLSNTimeout:      o.WaitLSNTimeout,
		CacheBytes:          o.CacheBytes,
		MaxLocalBytes:       0,
		UploadParallelism:   8,
	}
}

// ErrConfig marks an invalid configuration.
var ErrConfig = errors.New("pageserver: invalid config")

// Validate checks the configuration.
func (c Config) Validate() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrConfig}, a...)...) }
	switch {
	case c.ListenAddr == "":
		return bad("listen_addr is empty")
	case c.DataDir == "":
		return bad("data_dir is empty")
	case c.ImagePolicy != "writeback" && c.ImagePolicy != "fpi" && c.ImagePolicy != "pushdown" && c.ImagePolicy != "hot":
		return bad("image_policy %q: want writeback, fpi, pushdown or hot", c.ImagePolicy)
	case (c.ImagePolicy == "pushdown" || c.ImagePolicy == "hot") && c.PushdownDeltas <= 0:
		return bad("pushdown_deltas %d: must be positive", c.PushdownDeltas)
	case c.PushdownBytes < 0:
		return bad("pushdown_bytes %d: must be 0 (no limit) or positive", c.PushdownBytes)
	case c.ImagePolicy == "hot" && c.HotBurst <= 0:
		return bad("hot_burst %d: must be positive", c.HotBurst)
	case c.CheckpointDistance < 64<<10:
		return bad("checkpoint_distance %d is below 64 KiB", c.CheckpointDistance)
	case c.LayerTargetSize < 64<<10:
		return bad("layer_target_size %d is below 64 KiB", c.LayerTargetSize)
	case c.CompactionThreshold < 2:
		return bad("compaction_threshold must be at least 2")
	case c.WaitLSNTimeout <= 0 || c.CheckpointTimeout <= 0:
		return bad("timeouts must be positive")
	case c.ImageLayerBytes < 0:
		return bad("image_layer_bytes %d: must be 0 (256 MiB) or positive", c.ImageLayerBytes)
	case c.CacheBytes < 0 || c.MaxLocalBytes < 0 || c.UploadParallelism <= 0:
		return bad("cache_bytes, max_local_bytes must be >= 0 and upload_parallelism > 0")
	}
	return nil
}

// Options returns the timeline engine options of c.
func (c Config) Options() timeline.Options {
	return timeline.Options{
		CheckpointDistance:    c.CheckpointDistance,
		CheckpointLSNDistance: timeline.DefaultOptions().CheckpointLSNDistance,
		CheckpointTimeout:     c.CheckpointTimeout,
		LayerTargetSize:       c.LayerTargetSize,
		CompactionThreshold:   c.CompactionThreshold,
		GCHorizon:             c.GCHorizon,
		PITR:                  c.PITR,
		LeaseGrace:            timeline.DefaultOptions().LeaseGrace,
		WaitLSNTimeout:        c.WaitLSNTimeout,
		CacheBytes:            c.CacheBytes,
		MaxLocalBytes:         c.MaxLocalBytes,
		BackgroundInterval:    c.BackgroundInterval,
	}
}

// Policy returns the configured image policy. REQUIRES: Validate passed.
func (c Config) Policy() timeline.ImagePolicy {
	wb := timeline.WritebackPolicy{ImageLayerBytes: c.ImageLayerBytes}
	switch c.ImagePolicy {
	case "fpi":
		return timeline.FPIPolicy{WritebackPolicy: wb}
	case "pushdown":
		return timeline.PushdownPolicy{N: c.PushdownDeltas, NBytes: c.PushdownBytes, WritebackPolicy: wb}
	case "hot":
		return timeline.HotPolicy{PushdownPolicy: timeline.PushdownPolicy{N: c.PushdownDeltas, NBytes: c.PushdownBytes, WritebackPolicy: wb}, Burst: c.HotBurst}
	}
	return wb
}
