// Package s3 is the objectstore.Store for Amazon S3 and S3-compatible
// servers (MinIO, versitygw, Ceph RGW ...), on aws-sdk-go-v2.
//
// Put streams: objects below Config.MultipartThreshold go in one PutObject,
// larger or unknown-size ones through the SDK's upload manager as a
// multipart upload, so memory stays at a few part buffers whatever the
// object size. A conditional create (PutOptions.IfNotExists) sends
// If-None-Match: * on PutObject and on CompleteMultipartUpload, so S3 itself
// decides a race atomically; nothing is checked client-side first.
//
// It is not a general S3 client: no versioning, tagging, storage classes or
// server-side encryption settings (use bucket defaults for those).
package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	awss3 "github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go/logging"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// Store is an objectstore.Store over one S3 bucket (and optional prefix).
// It is safe for concurrent use.
type Store struct {
	cfg      Config
	log      zerolog.Logger
	client   *awss3.Client
	uploader *manager.Uploader //nolint:staticcheck // manager is deprecated for transfermanager, not in go.mod yet
	prefix   string            // "" or Config.Prefix ending in "/"
	closed   atomic.Bool
}

var _ objectstore.Store = (*Store)(nil)

// New validates cfg, loads credentials from the AWS SDK's default chain
// (failing at once, with what to set, when it finds none) and returns a
// Store. It contacts S3 only when cfg.CreateBucket is set.
func New(ctx context.Context, cfg Config, log zerolog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	var loadOpts []func(*awsconfig.LoadOptions) error
	if cfg.Region != "" {
		loadOpts = append(loadOpts, awsconfig.WithRegion(cfg.Region))
	}
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx, loadOpts...)
	if err != nil {
		return nil, fmt.Errorf("s3: loading AWS configuration: %w", err)
	}
	// Ask for credentials now (the SDK caches them for the first request):
	// with none anywhere, that request would fail with the chain's long
	// report, after a try of the EC2 metadata service; say what to set.
	if awsCfg.Credentials != nil {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := awsCfg.Credentials.Retrieve(cctx)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("s3: no AWS credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE with a profile in ~/.aws, or run with an instance or pod role (%w)", err)
		}
	}
	if awsCfg.Region == "" {
		if cfg.Endpoint == "" {
			return nil, errors.New("s3.region: required (or set AWS_REGION)")
		}
		awsCfg.Region = "us-east-1"
	}
	slog := log.With().Str("objectstore", "s3").Str("bucket", cfg.Bucket).Logger()
	// The SDK's own messages go to our logger (never request dumps: those
	// would carry signatures).
	awsCfg.Logger = sdkLogger{slog}
	awsCfg.ClientLogMode = 0
	client := awss3.NewFromConfig(awsCfg, func(o *awss3.Options) {
		o.DisableLogOutputChecksumValidationSkipped = true
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
	})
	s := &Store{
		cfg:    cfg,
		log:    slog,
		client: client,
		uploader: manager.NewUploader(client, func(u *manager.Uploader) { //nolint:staticcheck // see Store.uploader
			u.PartSize = cfg.PartSize
			u.Concurrency = cfg.UploadConcurrency
		}),
	}
	if p := strings.TrimSuffix(cfg.Prefix, "/"); p != "" {
		s.prefix = p + "/"
	}
	if cfg.CreateBucket {
		if err := s.createBucket(ctx, awsCfg.Region); err != nil {
			return nil, err
		}
	}
	s.log.Debug().Str("region", awsCfg.Region).Str("endpoint", cfg.Endpoint).
		Str("prefix", cfg.Prefix).Bool("path_style", cfg.PathStyle).Msg("s3 object store ready")
	return s, nil
}

func (s *Store) createBucket(ctx context.Context, region string) error {
	_, err := s.client.HeadBucket(ctx, &awss3.HeadBucketInput{Bucket: aws.String(s.cfg.Bucket)})
	if err == nil {
		return nil
	}
	if status, _ := errorStatus(err); status != 404 {
		return s.mapErr(ctx, "head bucket", "", err)
	}
	in := &awss3.CreateBucketInput{Bucket: aws.String(s.cfg.Bucket)}
	if region != "us-east-1" {
		in.CreateBucketConfiguration = &types.CreateBucketConfiguration{
			LocationConstraint: types.BucketLocationConstraint(region),
		}
	}
	_, err = s.client.CreateBucket(ctx, in)
	if err != nil {
		if _, code := errorStatus(err); code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
			return nil
		}
		return s.mapErr(ctx, "create bucket", "", err)
	}
	s.log.Info().Msg("created bucket")
	return nil
}

// Bucket returns the bucket name and Prefix returns the key prefix ("" or
// ending in "/") the store writes under.
func (s *Store) Bucket() string { return s.cfg.Bucket }

// Prefix: see Bucket.
func (s *Store) Prefix() string { return s.prefix }

func (s *Store) check(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return objectstore.ErrClosed
	}
	if err := objectstore.ValidateKey(key); err != nil {
		return err
	}
	if len(s.prefix)+len(key) > objectstore.MaxKeyLen {
		// S3 limits the whole key, prefix included.
		return fmt.Errorf("%w %q: longer than %d bytes after the prefix %q",
			objectstore.ErrInvalidKey, key, objectstore.MaxKeyLen-len(s.prefix), s.prefix)
	}
	return nil
}

// Put implements objectstore.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, opts objectstore.PutOptions) error {
	if err := s.check(ctx, key); err != nil {
		return err
	}
	sized := &sizeReader{r: objectstore.ContextReader(ctx, r), want: opts.Size, key: key}
	var body io.Reader = sized
	in := &awss3.PutObjectInput{
		Bucket: aws.String(s.cfg.Bucket),
		Key:    aws.String(s.prefix + key),
	}
	if opts.IfNotExists {
		in.IfNoneMatch = aws.String("*")
	}
	var err error
	if opts.Size >= 0 && opts.Size <= s.cfg.MultipartThreshold {
		err = s.putSingle(ctx, in, body, opts.Size)
	} else if opts.Size >= 0 {
		err = s.putMultipart(ctx, in, body)
	} else {
		// Unknown size: read up to the threshold to choose.
		var head bytes.Buffer
		n, rerr := head.ReadFrom(io.LimitReader(body, s.cfg.MultipartThreshold+1))
		switch {
		case rerr != nil:
			err = rerr // recorded in sized
		case n <= s.cfg.MultipartThreshold:
			err = s.putSingle(ctx, in, &head, n)
		default:
			err = s.putMultipart(ctx, in, io.MultiReader(&head, body))
		}
	}
	if err == nil {
		return nil
	}
	if sized.err != nil {
		// The body failed (or had the wrong size): nothing was committed.
		// The caller's reader error is not classified as the store's.
		if cerr := ctx.Err(); cerr != nil && !errors.Is(sized.err, cerr) {
			return fmt.Errorf("s3 put %q: %w (%v)", key, cerr, sized.err)
		}
		return fmt.Errorf("s3 put %q: reading body: %w", key, sized.err)
	}
	return s.putErr(ctx, key, opts, err)
}

// putSingle sends a body of size bytes (read into memory first, so that
// the SDK can sign, checksum and retry it) in one PutObject.
func (s *Store) putSingle(ctx context.Context, in *awss3.PutObjectInput, body io.Reader, size int64) error {
	buf := make([]byte, 0, size)
	b := bytes.NewBuffer(buf)
	if _, err := b.ReadFrom(body); err != nil {
		return err // recorded in sizeReader
	}
	in.Body = bytes.NewReader(b.Bytes())
	in.ContentLength = aws.Int64(int64(b.Len()))
	_, err := s.client.PutObject(ctx, in)
	return err
}

func (s *Store) putMultipart(ctx context.Context, in *awss3.PutObjectInput, body io.Reader) error {
	in.Body = body
	// The manager copies IfNoneMatch into CompleteMultipartUpload, where S3
	// decides the race, and aborts the upload on any failure.
	_, err := s.uploader.Upload(ctx, in)
	return err
}

// putErr maps a failed Put's error. A 409 ConditionalRequestConflict means
// a conflicting write to the key was in flight: it is ErrExists if the
// object now exists, and a transient failure (worth repeating) if not.
func (s *Store) putErr(ctx context.Context, key string, opts objectstore.PutOptions, err error) error {
	if ctx.Err() != nil {
		return s.mapErr(ctx, "put", key, err)
	}
	status, code := errorStatus(err)
	if opts.IfNotExists && (status == 412 || code == "PreconditionFailed") {
		return fmt.Errorf("s3 put %q: %w", key, objectstore.ErrExists)
	}
	if opts.IfNotExists && (status == 409 || code == "ConditionalRequestConflict") {
		if _, serr := s.Stat(ctx, key); serr == nil {
			return fmt.Errorf("s3 put %q: conflicting write: %w", key, objectstore.ErrExists)
		}
		return fmt.Errorf("s3 put %q: %w", key, objectstore.Transient(err))
	}
	return s.mapErr(ctx, "put", key, err)
}

// Get implements objectstore.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.get(ctx, key, "")
}

// GetRange implements objectstore.Store.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	if err := s.check(ctx, key); err != nil {
		return nil, err
	}
	if off < 0 {
		return nil, fmt.Errorf("s3 get %q: offset %d: %w", key, off, objectstore.ErrInvalidRange)
	}
	if length > math.MaxInt64-off {
		length = -1 // to the end; off+length would overflow
	}
	if length == 0 {
		// No HTTP range means zero bytes; check the key and offset only.
		info, err := s.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		if off > info.Size {
			return nil, fmt.Errorf("s3 get %q: offset %d, size %d: %w", key, off, info.Size, objectstore.ErrInvalidRange)
		}
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	rng := fmt.Sprintf("bytes=%d-", off)
	if length > 0 {
		rng = fmt.Sprintf("bytes=%d-%d", off, off+length-1)
	}
	if off == 0 && length < 0 {
		rng = ""
	}
	rc, err := s.get(ctx, key, rng)
	if !errors.Is(err, objectstore.ErrInvalidRange) {
		return rc, err
	}
	// S3 answers 416 both for off == size (which the contract reads as an
	// empty range) and for off > size.
	info, serr := s.Stat(ctx, key)
	if serr != nil {
		return nil, serr
	}
	if off == info.Size {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	return nil, fmt.Errorf("s3 get %q: offset %d, size %d: %w", key, off, info.Size, objectstore.ErrInvalidRange)
}

func (s *Store) get(ctx context.Context, key, rng string) (io.ReadCloser, error) {
	if err := s.check(ctx, key); err != nil {
		return nil, err
	}
	in := &awss3.GetObjectInput{Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.prefix + key)}
	if rng != "" {
		in.Range = aws.String(rng)
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		return nil, s.mapErr(ctx, "get", key, err)
	}
	return &bodyReader{ctx: ctx, rc: out.Body, key: key}, nil
}

// Stat implements objectstore.Store.
func (s *Store) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	if err := s.check(ctx, key); err != nil {
		return objectstore.ObjectInfo{}, err
	}
	out, err := s.client.HeadObject(ctx, &awss3.HeadObjectInput{
		Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.prefix + key),
	})
	if err != nil {
		return objectstore.ObjectInfo{}, s.mapErr(ctx, "stat", key, err)
	}
	return objectstore.ObjectInfo{
		Key:     key,
		Size:    aws.ToInt64(out.ContentLength),
		ModTime: aws.ToTime(out.LastModified),
	}, nil
}

// List implements objectstore.Store. It pages through ListObjectsV2 (1,000
// keys a page); S3 returns keys in ascending UTF-8 byte order.
func (s *Store) List(ctx context.Context, prefix string, fn func(objectstore.ObjectInfo) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return objectstore.ErrClosed
	}
	p := awss3.NewListObjectsV2Paginator(s.client, &awss3.ListObjectsV2Input{
		Bucket: aws.String(s.cfg.Bucket),
		Prefix: aws.String(s.prefix + listPrefix(prefix)),
	})
	for p.HasMorePages() {
		page, err := p.NextPage(ctx)
		if err != nil {
			return s.mapErr(ctx, "list", prefix, err)
		}
		for _, o := range page.Contents {
			key, ok := strings.CutPrefix(aws.ToString(o.Key), s.prefix)
			if !ok || objectstore.ValidateKey(key) != nil || !strings.HasPrefix(key, prefix) {
				continue // not one of ours, or cut off by listPrefix
			}
			err := fn(objectstore.ObjectInfo{
				Key:     key,
				Size:    aws.ToInt64(o.Size),
				ModTime: aws.ToTime(o.LastModified),
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// Delete implements objectstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check(ctx, key); err != nil {
		return err
	}
	_, err := s.client.DeleteObject(ctx, &awss3.DeleteObjectInput{
		Bucket: aws.String(s.cfg.Bucket), Key: aws.String(s.prefix + key),
	})
	if err != nil {
		err = s.mapErr(ctx, "delete", key, err)
		if errors.Is(err, objectstore.ErrNotFound) {
			return nil
		}
	}
	return err
}

// Close implements objectstore.Store. Later calls fail with
// objectstore.ErrClosed; readers already returned keep working until
// closed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return objectstore.ErrClosed
	}
	if c, ok := s.client.Options().HTTPClient.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	return nil
}

// sdkLogger forwards the AWS SDK's log lines to zerolog.
type sdkLogger struct{ log zerolog.Logger }

func (l sdkLogger) Logf(c logging.Classification, format string, v ...any) {
	ev := l.log.Debug()
	if c == logging.Warn {
		ev = l.log.Warn()
	}
	ev.Msgf("aws sdk: "+format, v...)
}

// listPrefix returns the part of prefix that can be sent to the service:
// keys are valid UTF-8, so a prefix that ends in a partial rune is cut back
// to the last whole one (the service may reject invalid UTF-8), and List
// filters with the full prefix.
func listPrefix(prefix string) string {
	for len(prefix) > 0 && !utf8.ValidString(prefix) {
		_, size := utf8.DecodeLastRuneInString(prefix)
		prefix = prefix[:len(prefix)-size]
	}
	return prefix
}
