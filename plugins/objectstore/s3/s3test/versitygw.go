// Package s3test starts a real S3 server for tests: versitygw
// (github.com/versity/versitygw, Apache-2.0) with its posix backend on a
// temporary folder, on a free 127.0.0.1 port, with SigV4 credentials.
//
//	gw := s3test.StartVersityGW(t) // skips (or fails in CI) when not installed
//	gw.SetEnv(t)                   // AWS_* variables for the SDK's default chain
//	st, err := s3.New(ctx, gw.Config("bucket", "prefix"), log)
//
// Install the binary with scripts/emulators/install.sh. The server is
// stopped when t ends; only the process this package started is signalled.
package s3test

import (
	"fmt"
	"github.com/stratadb/strata/internal/emulator"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratadb/strata/plugins/objectstore/s3"
)

// VersityGW is a running versitygw server.
type VersityGW struct {
	// Endpoint is the server's base URL, http://127.0.0.1:PORT.
	Endpoint string
	// AccessKey and SecretKey are the root credentials the server accepts.
	AccessKey, SecretKey string
	// Region is the region the server signs for.
	Region string
	// Dir is the posix backend's root: one sub-folder per bucket.
	Dir string
}

// StartVersityGW starts versitygw for the duration of t. When the binary is
// missing the test is skipped, or fails if STRATA_REQUIRE_EMULATORS=1.
func StartVersityGW(t testing.TB) *VersityGW {
	t.Helper()
	bin := emulator.FindBinary(t, "versitygw")
	gw := &VersityGW{
		AccessKey: "strata-test-access",
		SecretKey: "strata-test-secret-key-0123456789",
		Region:    "us-east-1",
		Dir:       filepath.Join(t.TempDir(), "posix"),
	}
	if err := os.MkdirAll(gw.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	port, _ := emulator.StartProcess(t, bin, func(port int) []string {
		return []string{
			"--access", gw.AccessKey,
			"--secret", gw.SecretKey,
			"--region", gw.Region,
			"--port", "127.0.0.1:" + strconv.Itoa(port),
			"--health", "/health",
			"--quiet",
			"posix", gw.Dir,
		}
	}, healthReady)
	gw.Endpoint = "http://127.0.0.1:" + strconv.Itoa(port)
	return gw
}

func healthReady(port int) error {
	if err := emulator.DialReady(port); err != nil {
		return err
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/health")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: GET /health: %s", emulator.ErrNotReady, resp.Status)
	}
	return nil
}

// SetEnv points the AWS SDK's default credential chain at the server's
// credentials for the duration of t (t.Setenv), and keeps the SDK from
// reading shared config files or contacting instance metadata.
func (gw *VersityGW) SetEnv(t testing.TB) {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("AWS_ACCESS_KEY_ID", gw.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", gw.SecretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_REGION", gw.Region)
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(dir, "credentials"))
}

// Config returns an s3.Config for bucket (created by New when missing) and
// prefix on this server.
func (gw *VersityGW) Config(bucket, prefix string) s3.Config {
	return s3.Config{
		Bucket:       bucket,
		Prefix:       prefix,
		Region:       gw.Region,
		Endpoint:     gw.Endpoint,
		PathStyle:    true,
		CreateBucket: true,
	}
}
