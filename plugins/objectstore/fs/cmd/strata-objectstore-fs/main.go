// Command strata-objectstore-fs runs the fs object store
// (plugins/objectstore/fs) as an external strata plugin. strata starts it
// when the config says:
//
//	objectstore:
//	  type: fs
//	  mode: external
//	  plugin: {path: /usr/lib/strata/strata-objectstore-fs, sha256: ...}
//	  fs: {root: /var/lib/strata/objects}
//
// The fs section reaches the plugin as JSON ({"root": ..., "no_sync": ...}).
// Run by hand, it only prints that it is a plugin.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/sdk/objectstore"
)

func open(configJSON []byte, log zerolog.Logger) (objectstore.Store, error) {
	var cfg fs.Config
	if len(bytes.TrimSpace(configJSON)) == 0 {
		configJSON = []byte("{}") // no section: fs.New says what is missing
	}
	dec := json.NewDecoder(bytes.NewReader(configJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("strata-objectstore-fs: config %s: %w", configJSON, err)
	}
	st, err := fs.New(cfg, log)
	if err != nil {
		return nil, err
	}
	log.Info().Str("root", st.Root()).Bool("no_sync", cfg.NoSync).Msg("fs object store plugin serving")
	return st, nil
}

func main() {
	objectstore.ServePlugin(open)
}
