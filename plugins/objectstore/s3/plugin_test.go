package s3_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/s3"
	"github.com/stratadb/strata/plugins/objectstore/s3/s3test"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// openShim serves s3.OpenPlugin through the object store's gRPC shim in
// this process (a real gRPC connection) and configures it with cfg as the
// host would: the s3 section as JSON.
func openShim(t *testing.T, cfg s3.Config) objectstore.Store {
	t.Helper()
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		objectstore.PluginKind: &objectstore.GRPCPlugin{Factory: s3.OpenPlugin, Log: zerolog.Nop()},
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
// gRPC shim, against versitygw.
func TestPlugin(t *testing.T) {
	gw := s3test.StartVersityGW(t)
	gw.SetEnv(t)
	var n atomic.Int64
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		if posixLimited["TestAcceptance/"+t.Name()[strings.LastIndex(t.Name(), "/")+1:]] {
			t.Skip("versitygw's posix backend keeps keys as file paths; see TestAcceptanceGoFakeS3")
		}
		return openShim(t, gw.Config("plugin", fmt.Sprintf("p/%d", n.Add(1))))
	}, storetest.Options{ListCount: 50, BigSize: 8 << 20, MaxKeyLen: 255, StrictClose: true})
}

func TestOpenPluginConfig(t *testing.T) {
	cases := []struct{ json, want string }{
		{``, "s3.bucket: required"},
		{`{}`, "s3.bucket: required"},
		{`{"bucket": "b", "no_such_key": 1}`, `unknown field "no_such_key"`},
		{`{"bucket": 7}`, "decoding the s3 config section"},
		{`{"bucket": "b", "part_size": 1}`, "s3.part_size:"},
	}
	for _, c := range cases {
		_, err := s3.OpenPlugin([]byte(c.json), zerolog.Nop())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("OpenPlugin(%s) = %v, want an error containing %q", c.json, err, c.want)
		}
	}
}
