package objstore_test

import (
	"bytes"
	"context"
	"io"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/internal/netfault"
	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
	"github.com/stratadb/strata/plugins/objectstore/gcs/gcstest"
	"github.com/stratadb/strata/plugins/objectstore/s3/s3test"
	"github.com/stratadb/strata/sdk/objectstore"
)

// TestStallTimeoutOnEveryStore: with the path to the store cut while a Put
// waits (connections left open, nothing answered), the call fails after
// objectstore.stall_timeout, is retried, and succeeds once the path is
// back; without the timeout it would wait for the dead connection for as
// long as the kernel keeps it. Each cloud store, as objstore.Open opens it
// for the servers.
func TestStallTimeoutOnEveryStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup points c at the emulator through a blackhole it returns.
		setup func(t *testing.T, c *config.ObjectStore) *netfault.Blackhole
	}{
		{"s3", func(t *testing.T, c *config.ObjectStore) *netfault.Blackhole {
			gw := s3test.StartVersityGW(t)
			gw.SetEnv(t)
			u, _ := url.Parse(gw.Endpoint)
			b := netfault.Start(t, u.Host)
			c.S3 = gw.Config("stall", "p")
			c.S3.Endpoint = "http://" + b.Addr()
			return b
		}},
		{"gcs", func(t *testing.T, c *config.ObjectStore) *netfault.Blackhole {
			f := gcstest.StartFakeGCS(t)
			b := netfault.Start(t, f.Host)
			t.Setenv("STORAGE_EMULATOR_HOST", b.Addr())
			c.GCS = f.Config("stall", "p")
			return b
		}},
		{"azure", func(t *testing.T, c *config.ObjectStore) *netfault.Blackhole {
			az := azuretest.StartAzurite(t)
			u, _ := url.Parse(az.BlobEndpoint)
			b := netfault.Start(t, u.Host)
			c.Azure = az.Config("stall", "p")
			c.Azure.ConnectionString = strings.Replace(az.ConnectionString, u.Host, b.Addr(), 1)
			return b
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := config.Default().ObjectStore
			c.Type = tc.name
			c.StallTimeout = time.Second
			b := tc.setup(t, &c)
			ctx := context.Background()
			st, err := objstore.Open(ctx, c, zerolog.Nop(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			if err := st.Put(ctx, "before", strings.NewReader("a"), objectstore.PutOptions{Size: 1}); err != nil {
				t.Fatal(err)
			}

			b.Freeze()
			done := make(chan error, 1)
			start := time.Now()
			go func() {
				done <- st.Put(ctx, "during", strings.NewReader("while the path was cut"), objectstore.PutOptions{Size: 22})
			}()
			time.Sleep(2500 * time.Millisecond)
			b.Thaw()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the put through a cut path, retried after the path came back: %v", err)
				}
				t.Logf("the put waited %s (the path cut for 2.5 s, stall timeout 1 s)", time.Since(start).Round(100*time.Millisecond))
			case <-time.After(40 * time.Second):
				t.Fatal("the put still waits 40 s after the path was cut: the stall timeout did not end it")
			}
			rc, err := st.Get(ctx, "during")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || !bytes.Equal(got, []byte("while the path was cut")) {
				t.Fatalf("read back %q, %v", got, err)
			}
		})
	}
}
