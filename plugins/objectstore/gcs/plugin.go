package gcs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// OpenPlugin is the objectstore.PluginFactory of the external gcs plugin
// (cmd/strata-objectstore-gcs): it decodes the host's objectstore.gcs
// section from JSON (the json tags of Config; unknown keys are an error)
// and opens a Store. Errors never echo the section (it may hold secrets).
func OpenPlugin(configJSON []byte, log zerolog.Logger) (objectstore.Store, error) {
	var cfg Config
	if len(bytes.TrimSpace(configJSON)) == 0 {
		configJSON = []byte("{}") // no section: Validate says what is missing
	}
	dec := json.NewDecoder(bytes.NewReader(configJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("strata-objectstore-gcs: decoding the gcs config section: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := New(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	log.Info().Msg("gcs object store plugin serving")
	return st, nil
}

var _ objectstore.PluginFactory = OpenPlugin
