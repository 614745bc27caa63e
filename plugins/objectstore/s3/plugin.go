package s3

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// OpenPlugin is the objectstore.PluginFactory of the external s3 plugin
// (cmd/strata-objectstore-s3): it decodes the host's objectstore.s3
// section from JSON (the json tags of Config; unknown keys are an error)
// and opens a Store. Errors never echo the section (it may hold secrets).
var OpenPlugin = objectstore.ConfigFactory("s3", func(ctx context.Context, cfg Config, log zerolog.Logger) (objectstore.Store, error) {
	return New(ctx, cfg, log)
})
