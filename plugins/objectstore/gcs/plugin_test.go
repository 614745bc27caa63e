package gcs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/gcs"
	"github.com/stratadb/strata/plugins/objectstore/gcs/gcstest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// openShim serves gcs.OpenPlugin through the object store's gRPC shim in
// this process (a real gRPC connection) and configures it with cfg as the
// host would: the gcs section as JSON.
func openShim(t *testing.T, cfg gcs.Config) objectstore.Store {
	t.Helper()
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		objectstore.PluginKind: &objectstore.GRPCPlugin{Factory: gcs.OpenPlugin, Log: zerolog.Nop()},
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

// TestPlugin runs the acceptance suite (smaller counts and sizes: the
// direct run covers them) through the external plugin's factory and the
// gRPC shim, against fake-gcs-server.
func TestPlugin(t *testing.T) {
	f := gcstest.StartFakeGCS(t)
	f.SetEnv(t)
	var n atomic.Int64
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		return openShim(t, f.Config("plugin", fmt.Sprintf("p/%d", n.Add(1))))
	}, storetest.Options{ListCount: 50, BigSize: 8 << 20, MaxKeyLen: objectstore.MaxKeyLen - len("p/NN/"), StrictClose: true})
}

func TestOpenPluginConfig(t *testing.T) {
	cases := []struct{ json, want string }{
		{``, "gcs.bucket: required"},
		{`{}`, "gcs.bucket: required"},
		{`{"bucket": "b", "no_such_key": 1}`, `unknown field "no_such_key"`},
		{`{"bucket": 7}`, "decoding the gcs config section"},
		{`{"bucket": "b", "chunk_size": -1}`, "gcs.chunk_size:"},
	}
	for _, c := range cases {
		_, err := gcs.OpenPlugin([]byte(c.json), zerolog.Nop())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OpenPlugin(%s) = %v, want an error containing %q", c.json, err, c.want)
		}
	}
}
