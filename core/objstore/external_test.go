package objstore_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pluginhost"
	"github.com/stratadb/strata/internal/testbin"
	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
	"github.com/stratadb/strata/plugins/objectstore/gcs/gcstest"
	"github.com/stratadb/strata/plugins/objectstore/s3/s3test"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// TestExternalStores runs the acceptance suite against every object store
// running as an external plugin: a real subprocess launched by the plugin
// host exactly as `objectstore.mode: external` in a config file does, with
// its checksum pinned, against the real emulators.
func TestExternalStores(t *testing.T) {
	var n atomic.Int64
	for _, tc := range []struct {
		name string
		// section sets the store's config and environment; prefix keeps
		// subtests apart.
		section func(t *testing.T, c *config.ObjectStore)
		skip    map[string]bool
	}{
		{"fs", func(t *testing.T, c *config.ObjectStore) {
			c.FS.Root = t.TempDir()
			c.FS.NoSync = true
		}, nil},
		{"s3", func(t *testing.T, c *config.ObjectStore) {
			gw := s3test.StartVersityGW(t)
			gw.SetEnv(t)
			c.S3 = gw.Config("external", "")
		}, map[string]bool{ // versitygw keeps keys as file paths; see plugins/objectstore/s3
			"ValidKeys": true, "KeyIsAlsoPrefix": true, "ListOrder": true, "MatchesReference": true,
		}},
		{"gcs", func(t *testing.T, c *config.ObjectStore) {
			f := gcstest.StartFakeGCS(t)
			f.SetEnv(t)
			c.GCS = f.Config("external", "")
		}, nil},
		{"azure", func(t *testing.T, c *config.ObjectStore) {
			az := azuretest.StartAzurite(t)
			c.Azure = az.Config("external", "")
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := testbin.ObjectStorePlugin(t, tc.name)
			sum, err := pluginhost.FileSHA256(bin)
			if err != nil {
				t.Fatal(err)
			}
			base := config.Default().ObjectStore
			base.Type, base.Mode = tc.name, config.ModeExternal
			base.Plugin.Path, base.Plugin.SHA256 = bin, sum
			tc.section(t, &base)
			storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
				if tc.skip[t.Name()[strings.LastIndex(t.Name(), "/")+1:]] {
					t.Skip("the emulator cannot store these keys")
				}
				c := base
				prefix := fmt.Sprintf("t%d", n.Add(1))
				switch tc.name {
				case "fs":
					c.FS.Root = t.TempDir()
				case "s3":
					c.S3.Prefix = prefix
				case "gcs":
					c.GCS.Prefix = prefix
				case "azure":
					c.Azure.Prefix = prefix
				}
				s, err := objstore.Open(context.Background(), c, zerolog.Nop(), nil)
				if err != nil {
					t.Fatal(err)
				}
				return s
			}, storetest.Options{ListCount: 1010, BigSize: 16 << 20, MaxKeyLen: 1000})
		})
	}
}
