package azure_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/azure"
	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// openShim serves azure.OpenPlugin through the object store's gRPC shim in
// this process (a real gRPC connection) and configures it with cfg as the
// host would: the azure section as JSON.
func openShim(t *testing.T, cfg azure.Config) objectstore.Store {
	t.Helper()
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		objectstore.PluginKind: &objectstore.GRPCPlugin{Factory: azure.OpenPlugin, Log: zerolog.Nop()},
	})
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(objectstore.PluginKind)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	c := raw.(*objectstore.GRPCClient)
	js, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Configure(context.Background(), js); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return c
}

// testPlugin runs the acceptance suite through the external plugin's
// factory and the gRPC shim, against Azurite, with a short listing and no
// big object (the direct run covers both, and Azurite is the slowest of the
// emulators).
func testPlugin(t *testing.T, az *azuretest.Azurite) {
	var n atomic.Int64
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		return openShim(t, az.Config("plugin", fmt.Sprintf("p/%d", n.Add(1))))
	}, storetest.Options{ListCount: 20, BigSize: -1, MaxKeyLen: objectstore.MaxKeyLen - len("p/NN/"), StrictClose: true})
}

func TestOpenPluginConfig(t *testing.T) {
	cases := []struct{ json, want string }{
		{``, "azure.container: required"},
		{`{}`, "azure.container: required"},
		{`{"container": "abc", "no_such_key": 1}`, `unknown field "no_such_key"`},
		{`{"container": 7}`, "decoding the azure config section"},
		{`{"container": "abc", "connection_string": "TOPSECRET", "account_url": "https://x/"}`, "not both"},
		{`{"container": "abc", "connection_string": "AccountName=a;AccountKey=TOPSECRET", "block_size": "x"}`, "decoding the azure config section"},
	}
	t.Setenv(azure.ConnectionStringEnv, "")
	for _, c := range cases {
		_, err := azure.OpenPlugin([]byte(c.json), zerolog.Nop())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OpenPlugin(%s) = %v, want an error containing %q", c.json, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "TOPSECRET") {
			t.Errorf("OpenPlugin's error shows the connection string: %v", err)
		}
	}
}
