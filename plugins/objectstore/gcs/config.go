package gcs

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/stratadb/strata/sdk/objectstore"
)

// DefaultChunkSize is the upload chunk size used when Config.ChunkSize is 0.
const DefaultChunkSize = 16 << 20

// Config is the gcs section of the strata configuration (objectstore.gcs).
//
// Credentials are not part of it: they come from Google's Application
// Default Credentials (GOOGLE_APPLICATION_CREDENTIALS naming a service
// account key file, `gcloud auth application-default login`, or the
// metadata server of GCE/GKE/Cloud Run). When the environment variable
// STORAGE_EMULATOR_HOST is set (host:port of an emulator such as
// fake-gcs-server), the client talks to it without credentials.
type Config struct {
	// Bucket is the bucket to keep objects in. Required.
	Bucket string `mapstructure:"bucket" json:"bucket"`
	// Prefix is prepended to every object name, followed by "/" (a trailing
	// "/" in Prefix is optional). Empty uses the bucket's root. GCS limits
	// whole names to 1,024 bytes, so the prefix shortens the usable key.
	Prefix string `mapstructure:"prefix" json:"prefix"`
	// Endpoint overrides the JSON API endpoint
	// ("https://storage.example.com/storage/v1/"). Empty uses Google's, or
	// STORAGE_EMULATOR_HOST when that is set.
	Endpoint string `mapstructure:"endpoint" json:"endpoint"`
	// ChunkSize is the size in bytes of each request of a resumable upload
	// (default 16 MiB; rounded up to a multiple of 256 KiB by the client).
	// Objects up to one chunk go in a single request. A Put buffers one
	// chunk.
	ChunkSize int `mapstructure:"chunk_size" json:"chunk_size"`
	// CreateBucket makes New create the bucket (in ProjectID) when it does
	// not exist. For tests and emulators.
	CreateBucket bool `mapstructure:"create_bucket" json:"create_bucket"`
	// ProjectID is the project CreateBucket creates the bucket in.
	ProjectID string `mapstructure:"project_id" json:"project_id"`
}

// Validate checks the settings without contacting GCS. Its messages name
// the offending key ("gcs.bucket: required").
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("gcs.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Bucket == "" {
		bad("bucket", "required")
	} else if strings.ContainsAny(c.Bucket, "/ ") {
		bad("bucket", "%q is not a bucket name (no '/' or spaces)", c.Bucket)
	}
	if c.Prefix != "" {
		if err := objectstore.ValidateKey(strings.TrimSuffix(c.Prefix, "/")); err != nil {
			bad("prefix", "%v", err)
		}
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil:
			bad("endpoint", "%v", err)
		case u.Scheme != "http" && u.Scheme != "https":
			bad("endpoint", "%q: want an http:// or https:// URL", c.Endpoint)
		case u.Host == "":
			bad("endpoint", "%q: no host", c.Endpoint)
		}
	}
	if c.ChunkSize < 0 {
		bad("chunk_size", "%d: want 0 (default %d) or more", c.ChunkSize, DefaultChunkSize)
	}
	if c.CreateBucket && c.ProjectID == "" {
		bad("project_id", "required with create_bucket")
	}
	return errors.Join(errs...)
}
