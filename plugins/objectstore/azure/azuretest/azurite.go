// Package azuretest starts a real Azure Blob emulator for tests: Azurite
// (github.com/Azure/Azurite, MIT, from npm), its blob service only, on a
// free 127.0.0.1 port with a temporary --location.
//
//	az := azuretest.StartAzurite(t) // skips (or fails in CI) when not installed
//	st, err := azure.New(ctx, az.Config("container", "prefix"), log)
//
// Install it with scripts/emulators/install.sh. The emulator is stopped when
// t ends; only the process this package started is signalled.
package azuretest

import (
	"fmt"
	"github.com/stratadb/strata/internal/emulator"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stratadb/strata/plugins/objectstore/azure"
)

// Azurite's well-known development account (public, documented by
// Microsoft; not a secret).
const (
	AccountName = "devstoreaccount1"
	AccountKey  = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// Azurite is a running azurite-blob.
type Azurite struct {
	// BlobEndpoint is the blob service URL of the development account,
	// http://127.0.0.1:PORT/devstoreaccount1.
	BlobEndpoint string
	// ConnectionString authenticates with the development account's key.
	ConnectionString string
	// Dir is the emulator's --location.
	Dir string
}

// StartAzurite starts azurite-blob for the duration of t. When it is
// missing the test is skipped, or fails if STRATA_REQUIRE_EMULATORS=1.
func StartAzurite(t testing.TB) *Azurite {
	t.Helper()
	bin := emulator.FindBinary(t, "azurite-blob")
	az := &Azurite{Dir: filepath.Join(t.TempDir(), "azurite")}
	if err := os.MkdirAll(az.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	port, _ := emulator.StartProcess(t, bin, func(port int) []string {
		return []string{
			"--blobHost", "127.0.0.1",
			"--blobPort", strconv.Itoa(port),
			"--location", az.Dir,
			"--skipApiVersionCheck",
			"--disableTelemetry",
			"--loose",
			"--silent",
		}
	}, azuriteReady)
	az.BlobEndpoint = fmt.Sprintf("http://127.0.0.1:%d/%s", port, AccountName)
	az.ConnectionString = fmt.Sprintf("DefaultEndpointsProtocol=http;AccountName=%s;AccountKey=%s;BlobEndpoint=%s;",
		AccountName, AccountKey, az.BlobEndpoint)
	return az
}

// azuriteReady succeeds once the blob service answers HTTP (any status: an
// unauthenticated request is refused, which is an answer).
func azuriteReady(port int) error {
	if err := emulator.DialReady(port); err != nil {
		return err
	}
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d/%s?comp=list", port, AccountName))
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Config returns an azure.Config for container (created by New when
// missing) and prefix on this emulator.
func (az *Azurite) Config(containerName, prefix string) azure.Config {
	return azure.Config{
		Container:        containerName,
		Prefix:           prefix,
		ConnectionString: az.ConnectionString,
		CreateContainer:  true,
	}
}
