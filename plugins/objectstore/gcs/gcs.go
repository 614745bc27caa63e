// Package gcs is the objectstore.Store for Google Cloud Storage, on
// cloud.google.com/go/storage (JSON API over HTTP).
//
// Put streams through the client's writer: objects up to Config.ChunkSize
// go in one request, larger ones in a resumable upload that becomes visible
// only when its last chunk is committed. A conditional create
// (PutOptions.IfNotExists) carries the precondition ifGenerationMatch=0
// (Conditions{DoesNotExist: true}), so GCS decides a race atomically and the
// loser gets 412, which Put reports as objectstore.ErrExists.
//
// It is not a general GCS client: no object metadata, ACLs, storage classes
// or customer-supplied keys.
package gcs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"cloud.google.com/go/storage"
	"github.com/rs/zerolog"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/stratadb/strata/sdk/objectstore"
)

// Store is an objectstore.Store over one GCS bucket (and optional prefix).
// It is safe for concurrent use.
type Store struct {
	cfg    Config
	log    zerolog.Logger
	client *storage.Client
	bucket *storage.BucketHandle
	prefix string // "" or Config.Prefix ending in "/"
	closed atomic.Bool
}

var _ objectstore.Store = (*Store)(nil)

// New validates cfg and returns a Store. Credentials come from Application
// Default Credentials, or none with STORAGE_EMULATOR_HOST. It contacts GCS
// only when cfg.CreateBucket is set.
func New(ctx context.Context, cfg Config, log zerolog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = DefaultChunkSize
	}
	opts := []option.ClientOption{storage.WithJSONReads()}
	if cfg.Endpoint != "" {
		opts = append(opts, option.WithEndpoint(cfg.Endpoint))
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcs: creating the client: %w", err)
	}
	s := &Store{
		cfg:    cfg,
		log:    log.With().Str("objectstore", "gcs").Str("bucket", cfg.Bucket).Logger(),
		client: client,
		bucket: client.Bucket(cfg.Bucket),
	}
	if p := strings.TrimSuffix(cfg.Prefix, "/"); p != "" {
		s.prefix = p + "/"
	}
	if cfg.CreateBucket {
		if err := s.createBucket(ctx); err != nil {
			client.Close()
			return nil, err
		}
	}
	s.log.Debug().Str("prefix", cfg.Prefix).Str("endpoint", cfg.Endpoint).Msg("gcs object store ready")
	return s, nil
}

func (s *Store) createBucket(ctx context.Context) error {
	_, err := s.bucket.Attrs(ctx)
	if err == nil {
		return nil
	}
	if !errors.Is(err, storage.ErrBucketNotExist) {
		return s.mapErr(ctx, "bucket attrs", "", err)
	}
	if err := s.bucket.Create(ctx, s.cfg.ProjectID, nil); err != nil && httpStatus(err) != 409 {
		return s.mapErr(ctx, "create bucket", "", err)
	}
	s.log.Info().Msg("created bucket")
	return nil
}

// Bucket returns the bucket name.
func (s *Store) Bucket() string { return s.cfg.Bucket }

// Prefix returns the name prefix ("" or ending in "/") the store writes
// under.
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
		// GCS limits the whole name, prefix included.
		return fmt.Errorf("%w %q: longer than %d bytes after the prefix %q",
			objectstore.ErrInvalidKey, key, objectstore.MaxKeyLen-len(s.prefix), s.prefix)
	}
	return nil
}

func (s *Store) object(key string) *storage.ObjectHandle {
	return s.bucket.Object(s.prefix + key)
}

// Put implements objectstore.Store. A failed or cancelled Put cancels the
// upload (the writer's context), so nothing of it becomes visible.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, opts objectstore.PutOptions) error {
	if err := s.check(ctx, key); err != nil {
		return err
	}
	obj := s.object(key)
	if opts.IfNotExists {
		obj = obj.If(storage.Conditions{DoesNotExist: true})
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := obj.NewWriter(wctx)
	w.ChunkSize = s.cfg.ChunkSize
	if opts.Size >= 0 && opts.Size < int64(w.ChunkSize) {
		// One request; no need for a chunk buffer larger than the object.
		w.ChunkSize = int(opts.Size) + 1
	}
	w.ContentType = "application/octet-stream"
	body := &readRecorder{r: objectstore.ContextReader(ctx, r)}
	n, err := io.Copy(w, body)
	switch {
	case body.err != nil:
		err = fmt.Errorf("gcs put %q: reading body: %w", key, body.err)
	case err != nil:
		err = s.putErr(ctx, key, opts, err) // the upload failed mid-stream
	case opts.Size >= 0 && n != opts.Size:
		err = fmt.Errorf("gcs put %q: body has %d bytes, PutOptions.Size said %d", key, n, opts.Size)
	}
	if err != nil {
		cancel() // abandons the upload before it is committed
		_ = w.Close()
		if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
			return fmt.Errorf("%w (%v)", cerr, err)
		}
		return err
	}
	if err := w.Close(); err != nil {
		return s.putErr(ctx, key, opts, err)
	}
	return nil
}

// putErr maps an upload error: 412 on a conditional create (at the start of
// a resumable upload or at its commit) is ErrExists.
func (s *Store) putErr(ctx context.Context, key string, opts objectstore.PutOptions, err error) error {
	if opts.IfNotExists && ctx.Err() == nil && httpStatus(err) == 412 {
		return fmt.Errorf("gcs put %q: %w", key, objectstore.ErrExists)
	}
	return s.mapErr(ctx, "put", key, err)
}

// Get implements objectstore.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return s.GetRange(ctx, key, 0, -1)
}

// GetRange implements objectstore.Store.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	if err := s.check(ctx, key); err != nil {
		return nil, err
	}
	if off < 0 {
		return nil, fmt.Errorf("gcs get %q: offset %d: %w", key, off, objectstore.ErrInvalidRange)
	}
	if length > math.MaxInt64-off {
		length = -1 // to the end; off+length would overflow
	}
	if length == 0 {
		info, err := s.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		if off > info.Size {
			return nil, fmt.Errorf("gcs get %q: offset %d, size %d: %w", key, off, info.Size, objectstore.ErrInvalidRange)
		}
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	rd, err := s.object(key).NewRangeReader(ctx, off, length)
	if err == nil {
		if off > rd.Attrs.Size {
			rd.Close()
			return nil, fmt.Errorf("gcs get %q: offset %d, size %d: %w", key, off, rd.Attrs.Size, objectstore.ErrInvalidRange)
		}
		return &bodyReader{ctx: ctx, rc: rd, key: key}, nil
	}
	err = s.mapErr(ctx, "get", key, err)
	if !errors.Is(err, objectstore.ErrInvalidRange) {
		return nil, err
	}
	// 416 for off == size (an empty range by the contract) and off > size.
	info, serr := s.Stat(ctx, key)
	if serr != nil {
		return nil, serr
	}
	if off == info.Size {
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	return nil, fmt.Errorf("gcs get %q: offset %d, size %d: %w", key, off, info.Size, objectstore.ErrInvalidRange)
}

// Stat implements objectstore.Store.
func (s *Store) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	if err := s.check(ctx, key); err != nil {
		return objectstore.ObjectInfo{}, err
	}
	a, err := s.object(key).Attrs(ctx)
	if err != nil {
		return objectstore.ObjectInfo{}, s.mapErr(ctx, "stat", key, err)
	}
	return objectstore.ObjectInfo{Key: key, Size: a.Size, ModTime: a.Updated}, nil
}

// List implements objectstore.Store. GCS lists names in ascending UTF-8
// byte order, 1,000 a page; the iterator pages.
func (s *Store) List(ctx context.Context, prefix string, fn func(objectstore.ObjectInfo) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return objectstore.ErrClosed
	}
	q := &storage.Query{Prefix: s.prefix + listPrefix(prefix)}
	if err := q.SetAttrSelection([]string{"Name", "Size", "Updated"}); err != nil {
		return fmt.Errorf("gcs list: %w", err)
	}
	it := s.bucket.Objects(ctx, q)
	for {
		a, err := it.Next()
		if err == iterator.Done {
			return nil
		}
		if err != nil {
			return s.mapErr(ctx, "list", prefix, err)
		}
		key, ok := strings.CutPrefix(a.Name, s.prefix)
		if !ok || objectstore.ValidateKey(key) != nil || !strings.HasPrefix(key, prefix) {
			continue // not one of ours, or cut off by listPrefix
		}
		if err := fn(objectstore.ObjectInfo{Key: key, Size: a.Size, ModTime: a.Updated}); err != nil {
			return err
		}
	}
}

// Delete implements objectstore.Store.
func (s *Store) Delete(ctx context.Context, key string) error {
	if err := s.check(ctx, key); err != nil {
		return err
	}
	err := s.object(key).Delete(ctx)
	if err == nil || errors.Is(err, storage.ErrObjectNotExist) {
		return nil
	}
	return s.mapErr(ctx, "delete", key, err)
}

// Close implements objectstore.Store. Later calls fail with
// objectstore.ErrClosed.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return objectstore.ErrClosed
	}
	return s.client.Close()
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
