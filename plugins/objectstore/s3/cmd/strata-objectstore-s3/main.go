// Command strata-objectstore-s3 runs the s3 object store
// (plugins/objectstore/s3) as an external strata plugin. strata starts it
// when the config says:
//
//	objectstore:
//	  type: s3
//	  mode: external
//	  plugin: {path: /usr/lib/strata/strata-objectstore-s3, sha256: ...}
//	  s3: {bucket: ..., prefix: ..., region: ..., endpoint: ..., path_style: true}
//
// The s3 section reaches the plugin as JSON; credentials come from the AWS
// SDK's default chain in the plugin's environment. Run by hand, it only
// prints that it is a plugin.
package main

import (
	"github.com/stratadb/strata/plugins/objectstore/s3"
	"github.com/stratadb/strata/sdk/objectstore"
)

func main() { objectstore.ServePlugin(s3.OpenPlugin) }
