// Command strata-objectstore-azure runs the azure object store
// (plugins/objectstore/azure) as an external strata plugin. strata starts it
// when the config says:
//
//	objectstore:
//	  type: azure
//	  mode: external
//	  plugin: {path: /usr/lib/strata/strata-objectstore-azure, sha256: ...}
//	  azure: {container: ..., prefix: ..., account_url: ...}
//
// The azure section reaches the plugin as JSON. Credentials: the section's
// connection_string, else AZURE_STORAGE_CONNECTION_STRING, or account_url
// with DefaultAzureCredential, in the plugin's environment. Run by hand, it
// only prints that it is a plugin.
package main

import (
	"github.com/stratadb/strata/plugins/objectstore/azure"
	"github.com/stratadb/strata/sdk/objectstore"
)

func main() { objectstore.ServePlugin(azure.OpenPlugin) }
