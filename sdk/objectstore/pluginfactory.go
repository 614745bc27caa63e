package objectstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/rs/zerolog"
)

// ConfigFactory returns the PluginFactory of a store whose config section
// decodes into C: the section is decoded from JSON with C's json tags
// (unknown keys are an error; an empty section decodes as "{}" so that the
// store's own validation says what is missing), then open builds the store
// within a minute. Errors name the plugin and never echo the section, which
// may hold secrets.
func ConfigFactory[C any](name string, open func(ctx context.Context, cfg C, log zerolog.Logger) (Store, error)) PluginFactory {
	return func(configJSON []byte, log zerolog.Logger) (Store, error) {
		var cfg C
		if len(bytes.TrimSpace(configJSON)) == 0 {
			configJSON = []byte("{}")
		}
		dec := json.NewDecoder(bytes.NewReader(configJSON))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&cfg); err != nil {
			return nil, fmt.Errorf("strata-objectstore-%s: decoding the %s config section: %w", name, name, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		st, err := open(ctx, cfg, log)
		if err != nil {
			return nil, err
		}
		log.Info().Msgf("%s object store plugin serving", name)
		return st, nil
	}
}
