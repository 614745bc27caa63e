package gcs

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// OpenPlugin is the objectstore.PluginFactory of the external gcs plugin
// (cmd/strata-objectstore-gcs): it decodes the host's objectstore.gcs
// section from JSON (the json tags of Config; unknown keys are an error)
// and opens a Store. Errors never echo the section (it may hold secrets).
var OpenPlugin = objectstore.ConfigFactory("gcs", func(ctx context.Context, cfg Config, log zerolog.Logger) (objectstore.Store, error) {
	return New(ctx, cfg, log)
})
