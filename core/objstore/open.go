// Package objstore opens the object store that a strata config names: a
// builtin plugin linked into this binary or an external plugin process, in
// both cases wrapped with metrics, retries and, for the cloud stores, a
// stall timeout. It is the one place that switches on objectstore.type.
package objstore

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/pluginhost"
	"github.com/stratadb/strata/plugins/objectstore/azure"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/plugins/objectstore/gcs"
	"github.com/stratadb/strata/plugins/objectstore/s3"
	"github.com/stratadb/strata/sdk/objectstore"
)

// Open builds the store that cfg selects. reg may be nil (no metrics).
// The caller owns the store and must Close it.
func Open(ctx context.Context, cfg config.ObjectStore, log zerolog.Logger, reg prometheus.Registerer) (objectstore.Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", config.ErrInvalid, err)
	}
	log = log.With().Str("objectstore", cfg.Type).Str("mode", cfg.Mode).Logger()
	var (
		s   objectstore.Store
		err error
	)
	if cfg.Mode == config.ModeExternal {
		s, err = openExternal(ctx, cfg, log)
	} else {
		s, err = openBuiltin(ctx, cfg, log)
	}
	if err != nil {
		return nil, err
	}
	if reg != nil {
		s = objectstore.WithMetrics(s, reg, cfg.Type)
	}
	if cfg.Type != "fs" {
		// A local folder's calls do not end on a cancelled context, and
		// fs puts a layer file by a hard link, which the wrapper would
		// turn into a copy.
		s = objectstore.WithStallTimeout(s, cfg.StallTimeout)
	}
	return objectstore.WithRetry(s, objectstore.DefaultRetryPolicy(), log), nil
}

func openBuiltin(ctx context.Context, cfg config.ObjectStore, log zerolog.Logger) (objectstore.Store, error) {
	switch cfg.Type {
	case "fs":
		return fs.New(cfg.FS, log)
	case "s3":
		return s3.New(ctx, cfg.S3, log)
	case "gcs":
		return gcs.New(ctx, cfg.GCS, log)
	case "azure":
		return azure.New(ctx, cfg.Azure, log)
	}
	return nil, fmt.Errorf("objstore: no builtin object store %q", cfg.Type)
}

func openExternal(ctx context.Context, cfg config.ObjectStore, log zerolog.Logger) (objectstore.Store, error) {
	section, err := json.Marshal(cfg.Section())
	if err != nil {
		return nil, fmt.Errorf("objstore: encoding the %s section for the plugin: %w", cfg.Type, err)
	}
	return pluginhost.OpenObjectStore(ctx, pluginhost.Spec{
		Name:       cfg.Type,
		Path:       cfg.Plugin.Path,
		Args:       cfg.Plugin.Args,
		SHA256:     cfg.Plugin.SHA256,
		ConfigJSON: section,
	}, log)
}
