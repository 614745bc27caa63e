package main

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
	"github.com/stratadb/strata/plugins/objectstore/gcs/gcstest"
	"github.com/stratadb/strata/plugins/objectstore/s3/s3test"
)

// TestObjectStoreCommandEveryStore drives `strata objectstore` against each
// cloud store's real emulator, configured the way an operator would: the
// section in the YAML file, credentials in the environment.
func TestObjectStoreCommandEveryStore(t *testing.T) {
	bin := buildStrata(t)
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) string // returns the objectstore section
	}{
		{"s3", func(t *testing.T) string {
			gw := s3test.StartVersityGW(t)
			gw.SetEnv(t)
			return "  type: s3\n  s3:\n    bucket: cli\n    endpoint: " + gw.Endpoint + "\n    region: " + gw.Region + "\n    path_style: true\n    create_bucket: true\n"
		}},
		{"gcs", func(t *testing.T) string {
			f := gcstest.StartFakeGCS(t)
			f.SetEnv(t)
			return "  type: gcs\n  gcs:\n    bucket: cli\n    create_bucket: true\n    project_id: strata-test\n"
		}},
		{"azure", func(t *testing.T) string {
			az := azuretest.StartAzurite(t)
			// The secret stays out of the file, as an operator would do.
			t.Setenv("STRATA_OBJECTSTORE_AZURE_CONNECTION_STRING", az.ConnectionString)
			return "  type: azure\n  azure:\n    container: cli\n    create_container: true\n"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			section := tc.setup(t)
			dir := t.TempDir()
			cfg := filepath.Join(dir, "c.yaml")
			if err := os.WriteFile(cfg, []byte("objectstore:\n"+section), 0o644); err != nil {
				t.Fatal(err)
			}
			data := make([]byte, 6<<20+123)
			rand.Read(data)
			src := filepath.Join(dir, "src")
			os.WriteFile(src, data, 0o644)
			if _, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "put", "dir/big", src); code != 0 {
				t.Fatalf("put: %d %s", code, e)
			}
			if _, e, code := run(t, bin, dir, []byte("x"), "--config", cfg, "objectstore", "put", "--if-not-exists", "dir/big", "-"); code == 0 || !strings.Contains(e, "exists") {
				t.Fatalf("conditional put over an existing key: %d %q", code, e)
			}
			out, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "ls", "dir/")
			if code != 0 || !strings.Contains(out, "dir/big") || !strings.Contains(out, "6291579") {
				t.Fatalf("ls: %d %q %s", code, out, e)
			}
			dst := filepath.Join(dir, "dst")
			if _, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "get", "dir/big", dst); code != 0 {
				t.Fatalf("get: %d %s", code, e)
			}
			if got, _ := os.ReadFile(dst); !bytes.Equal(got, data) {
				t.Fatal("get returned different bytes")
			}
			if _, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "rm", "dir/big"); code != 0 {
				t.Fatalf("rm: %d %s", code, e)
			}
			if _, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "get", "dir/big", dst); code != 1 || !strings.Contains(e, "not found") {
				t.Fatalf("get after rm: %d %q", code, e)
			}
		})
	}
}
