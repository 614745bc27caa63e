// Command objectstore-memory is a minimal external object store plugin for
// strata: it serves the in-memory reference store (objectstore.Memory) over
// the plugin protocol. Integrators copy it as the starting point of their
// own plugin; strata's tests run the acceptance suite against it through a
// real process boundary.
//
// Its contents live in the plugin process's memory: they vanish when the
// process exits or is restarted. Do not use it for data you want to keep.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// config is this plugin's config section (objectstore.plugin.config in
// strata's YAML, handed over as JSON). Unknown keys are refused so that
// typos show.
type config struct {
	// Prefix, if set, puts every key under this prefix inside the store
	// (a demonstration of wrapping a Store; harmless otherwise).
	Prefix string `json:"prefix"`
}

func open(configJSON []byte, log zerolog.Logger) (objectstore.Store, error) {
	var cfg config
	if len(bytes.TrimSpace(configJSON)) > 0 {
		if err := strictUnmarshal(configJSON, &cfg); err != nil {
			return nil, fmt.Errorf("objectstore-memory: config: %w", err)
		}
	}
	log.Info().Str("prefix", cfg.Prefix).Msg("objectstore-memory: serving an in-memory store")
	var st objectstore.Store = objectstore.NewMemory()
	if cfg.Prefix != "" {
		st = objectstore.WithPrefix(st, cfg.Prefix)
	}
	return st, nil
}

func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

func main() {
	objectstore.ServePlugin(open)
}
