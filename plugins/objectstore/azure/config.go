package azure

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/stratadb/strata/sdk/objectstore"
)

// ConnectionStringEnv is read when neither connection_string nor
// account_url is set, so that the secret can stay out of the config file.
const ConnectionStringEnv = "AZURE_STORAGE_CONNECTION_STRING"

// Defaults for the upload settings left at zero in Config.
const (
	DefaultBlockSize         int64 = 8 << 20
	DefaultUploadConcurrency       = 4

	maxBlockSize int64 = 4000 << 20 // Azure's largest block
)

// Config is the azure section of the strata configuration (objectstore.azure).
//
// Credentials: either ConnectionString (an account key or SAS in it; or the
// AZURE_STORAGE_CONNECTION_STRING variable when both ConnectionString and
// AccountURL are empty), or AccountURL with azidentity's
// DefaultAzureCredential (AZURE_CLIENT_ID / AZURE_TENANT_ID /
// AZURE_CLIENT_SECRET or a certificate, workload identity, managed
// identity, or `az login`).
type Config struct {
	// Container is the blob container to keep objects in. Required.
	Container string `mapstructure:"container" json:"container"`
	// Prefix is prepended to every blob name, followed by "/" (a trailing
	// "/" in Prefix is optional). Empty uses the container's root.
	Prefix string `mapstructure:"prefix" json:"prefix"`
	// ConnectionString is a storage account connection string. It holds a
	// secret: prefer the AZURE_STORAGE_CONNECTION_STRING variable.
	ConnectionString string `mapstructure:"connection_string" json:"connection_string"`
	// AccountURL is the blob service URL
	// ("https://ACCOUNT.blob.core.windows.net/"), used with
	// DefaultAzureCredential. Set it or ConnectionString, not both.
	AccountURL string `mapstructure:"account_url" json:"account_url"`
	// BlockSize is the size in bytes of each staged block of a large Put
	// (default 8 MiB, at most 4000 MiB). Objects smaller than one block go
	// in a single Put Blob request. A Put holds up to UploadConcurrency
	// blocks in memory.
	BlockSize int64 `mapstructure:"block_size" json:"block_size"`
	// UploadConcurrency is how many blocks of one Put are staged at once
	// (default 4).
	UploadConcurrency int `mapstructure:"upload_concurrency" json:"upload_concurrency"`
	// CreateContainer makes New create the container when it does not
	// exist. For tests and emulators.
	CreateContainer bool `mapstructure:"create_container" json:"create_container"`
}

// String describes the config without its secret.
func (c Config) String() string {
	cs := ""
	if c.ConnectionString != "" {
		cs = "<redacted>"
	}
	return fmt.Sprintf("{Container:%s Prefix:%s ConnectionString:%s AccountURL:%s BlockSize:%d UploadConcurrency:%d CreateContainer:%v}",
		c.Container, c.Prefix, cs, c.AccountURL, c.BlockSize, c.UploadConcurrency, c.CreateContainer)
}

// Validate checks the settings without contacting Azure. Its messages
// name the offending key ("azure.container: required") and never include
// the connection string.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("azure.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Container == "" {
		bad("container", "required")
	} else if !validContainer(c.Container) {
		bad("container", "%q: want 3 to 63 lower-case letters, digits and single hyphens", c.Container)
	}
	if c.Prefix != "" {
		if err := objectstore.ValidateKey(strings.TrimSuffix(c.Prefix, "/")); err != nil {
			bad("prefix", "%v", err)
		}
	}
	switch {
	case c.ConnectionString != "" && c.AccountURL != "":
		bad("connection_string", "set connection_string or account_url, not both")
	case c.ConnectionString == "" && c.AccountURL == "" && os.Getenv(ConnectionStringEnv) == "":
		bad("account_url", "required (or azure.connection_string, or the %s variable)", ConnectionStringEnv)
	case c.ConnectionString != "" && !strings.Contains(c.ConnectionString, "="):
		bad("connection_string", "not a connection string (want Key=Value;... pairs)")
	}
	if c.AccountURL != "" {
		u, err := url.Parse(c.AccountURL)
		switch {
		case err != nil:
			bad("account_url", "%v", err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("account_url", "%q: want an https:// URL", c.AccountURL)
		case u.Host == "":
			bad("account_url", "%q: no host", c.AccountURL)
		}
	}
	if c.BlockSize < 0 || c.BlockSize > maxBlockSize {
		bad("block_size", "%d: want 0 (default %d) to %d bytes", c.BlockSize, DefaultBlockSize, maxBlockSize)
	}
	if c.UploadConcurrency < 0 {
		bad("upload_concurrency", "%d: want 0 (default %d) or more", c.UploadConcurrency, DefaultUploadConcurrency)
	}
	return errors.Join(errs...)
}

func validContainer(name string) bool {
	if len(name) < 3 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' || strings.Contains(name, "--") {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}
