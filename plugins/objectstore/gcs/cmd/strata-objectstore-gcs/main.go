// Command strata-objectstore-gcs runs the gcs object store
// (plugins/objectstore/gcs) as an external strata plugin. strata starts it
// when the config says:
//
//	objectstore:
//	  type: gcs
//	  mode: external
//	  plugin: {path: /usr/lib/strata/strata-objectstore-gcs, sha256: ...}
//	  gcs: {bucket: ..., prefix: ..., endpoint: ...}
//
// The gcs section reaches the plugin as JSON; credentials come from
// Application Default Credentials (or none with STORAGE_EMULATOR_HOST) in
// the plugin's environment. Run by hand, it only prints that it is a plugin.
package main

import (
	"github.com/stratadb/strata/plugins/objectstore/gcs"
	"github.com/stratadb/strata/sdk/objectstore"
)

func main() { objectstore.ServePlugin(gcs.OpenPlugin) }
