package s3

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/stratadb/strata/sdk/objectstore"
)

// Defaults for the upload settings left at zero in Config.
const (
	DefaultMultipartThreshold int64 = 16 << 20
	DefaultPartSize           int64 = 16 << 20
	DefaultUploadConcurrency        = 4

	minPartSize int64 = 5 << 20 // S3's minimum part size (except the last part)
	maxPartSize int64 = 5 << 30 // S3's maximum part size and single PutObject size
)

// Config is the s3 section of the strata configuration (objectstore.s3).
//
// Credentials are not part of it: they come from the AWS SDK's default chain
// (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, the shared
// files ~/.aws/credentials and ~/.aws/config with AWS_PROFILE, web identity,
// ECS and EC2 instance roles), so that no secret lives in a strata file.
type Config struct {
	// Bucket is the bucket to keep objects in. Required.
	Bucket string `mapstructure:"bucket" json:"bucket"`
	// Prefix is prepended to every key, followed by "/" (a trailing "/" in
	// Prefix is optional). Empty uses the bucket's root. It shortens the
	// longest usable key: S3 accepts keys of at most 1,024 bytes in all.
	Prefix string `mapstructure:"prefix" json:"prefix"`
	// Region is the bucket's region. Empty takes it from the SDK's chain
	// (AWS_REGION, AWS_DEFAULT_REGION, the shared config), or "us-east-1"
	// when Endpoint is set (S3-compatible servers mostly ignore it).
	Region string `mapstructure:"region" json:"region"`
	// Endpoint is the base URL of an S3-compatible server
	// ("http://127.0.0.1:7070", "https://minio.example:9000"). Empty uses
	// AWS S3.
	Endpoint string `mapstructure:"endpoint" json:"endpoint"`
	// PathStyle addresses the bucket in the path (endpoint/bucket/key)
	// rather than in the host name (bucket.endpoint/key). Most
	// S3-compatible servers need it.
	PathStyle bool `mapstructure:"path_style" json:"path_style"`
	// MultipartThreshold is the object size in bytes from which Put uses a
	// multipart upload (default 16 MiB, at most 5 GiB). Smaller objects go in
	// one PutObject request.
	MultipartThreshold int64 `mapstructure:"multipart_threshold" json:"multipart_threshold"`
	// PartSize is the size in bytes of each part of a multipart upload
	// (default 16 MiB, 5 MiB to 5 GiB). A Put holds about
	// (UploadConcurrency+1) * PartSize bytes of buffers while it runs.
	PartSize int64 `mapstructure:"part_size" json:"part_size"`
	// UploadConcurrency is how many parts of one multipart upload are sent
	// at once (default 4).
	UploadConcurrency int `mapstructure:"upload_concurrency" json:"upload_concurrency"`
	// CreateBucket makes New create the bucket when it does not exist. For
	// tests and emulators; production buckets are made by their operators.
	CreateBucket bool `mapstructure:"create_bucket" json:"create_bucket"`
}

// Validate checks the settings without contacting S3. Its messages name
// the offending key ("s3.bucket: required").
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("s3.%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if c.Bucket == "" {
		bad("bucket", "required")
	} else if strings.ContainsAny(c.Bucket, "/ ") {
		bad("bucket", "%q is not a bucket name (no '/' or spaces)", c.Bucket)
	}
	if err := validatePrefix(c.Prefix); err != nil {
		bad("prefix", "%v", err)
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
	if c.MultipartThreshold < 0 || c.MultipartThreshold > maxPartSize {
		bad("multipart_threshold", "%d: want 0 (default %d) to %d bytes", c.MultipartThreshold, DefaultMultipartThreshold, maxPartSize)
	}
	if c.PartSize != 0 && (c.PartSize < minPartSize || c.PartSize > maxPartSize) {
		bad("part_size", "%d: want 0 (default %d) or %d to %d bytes", c.PartSize, DefaultPartSize, minPartSize, maxPartSize)
	}
	if c.UploadConcurrency < 0 {
		bad("upload_concurrency", "%d: want 0 (default %d) or more", c.UploadConcurrency, DefaultUploadConcurrency)
	}
	return errors.Join(errs...)
}

// validatePrefix checks that prefix, without one trailing "/", is a valid
// key, so that prefix + "/" + key is a valid key for every valid key.
func validatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return objectstore.ValidateKey(strings.TrimSuffix(prefix, "/"))
}

func (c Config) withDefaults() Config {
	if c.MultipartThreshold == 0 {
		c.MultipartThreshold = DefaultMultipartThreshold
	}
	if c.PartSize == 0 {
		c.PartSize = DefaultPartSize
	}
	if c.UploadConcurrency == 0 {
		c.UploadConcurrency = DefaultUploadConcurrency
	}
	return c
}
