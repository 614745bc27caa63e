// Package azure is the objectstore.Store for Azure Blob Storage, on the
// azblob SDK (block blobs).
//
// Put streams with UploadStream: an object smaller than one block goes in a
// single Put Blob, a larger one is staged block by block and becomes
// visible, all at once, when its block list is committed. A conditional
// create (PutOptions.IfNotExists) sends If-None-Match: * on that Put Blob or
// Put Block List, so Azure decides a race atomically; a loser gets 409
// BlobAlreadyExists or 412 ConditionNotMet, both reported as
// objectstore.ErrExists.
//
// It is not a general Azure client: no page or append blobs, tiers,
// snapshots, leases or metadata.
package azure

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync/atomic"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// Store is an objectstore.Store over one Azure blob container (and
// optional prefix). It is safe for concurrent use.
type Store struct {
	cfg       Config
	log       zerolog.Logger
	container *container.Client
	prefix    string // "" or Config.Prefix ending in "/"
	closed    atomic.Bool
}

var _ objectstore.Store = (*Store)(nil)

// New validates cfg and returns a Store. It contacts Azure only when
// cfg.CreateContainer is set. The connection string is never logged.
func New(ctx context.Context, cfg Config, log zerolog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.BlockSize == 0 {
		cfg.BlockSize = DefaultBlockSize
	}
	if cfg.UploadConcurrency == 0 {
		cfg.UploadConcurrency = DefaultUploadConcurrency
	}
	var (
		cc   *container.Client
		err  error
		auth string
	)
	switch {
	case cfg.AccountURL != "":
		cred, cerr := azidentity.NewDefaultAzureCredential(nil)
		if cerr != nil {
			return nil, fmt.Errorf("azure: DefaultAzureCredential: %w", cerr)
		}
		u := strings.TrimSuffix(cfg.AccountURL, "/") + "/" + cfg.Container
		cc, err = container.NewClient(u, cred, nil)
		auth = "DefaultAzureCredential"
	default:
		cs := cfg.ConnectionString
		auth = "connection_string"
		if cs == "" {
			cs = os.Getenv(ConnectionStringEnv)
			auth = ConnectionStringEnv
		}
		cc, err = container.NewClientFromConnectionString(cs, cfg.Container, nil)
	}
	if err != nil {
		// The SDK's parse errors do not echo the connection string.
		return nil, fmt.Errorf("azure: creating the client (%s): %w", auth, err)
	}
	s := &Store{
		cfg:       cfg,
		log:       log.With().Str("objectstore", "azure").Str("container", cfg.Container).Logger(),
		container: cc,
	}
	if p := strings.TrimSuffix(cfg.Prefix, "/"); p != "" {
		s.prefix = p + "/"
	}
	if cfg.CreateContainer {
		_, err := cc.Create(ctx, nil)
		if err != nil && !bloberror.HasCode(err, bloberror.ContainerAlreadyExists) {
			return nil, s.mapErr(ctx, "create container", "", err)
		}
		if err == nil {
			s.log.Info().Msg("created container")
		}
	}
	s.log.Debug().Str("prefix", cfg.Prefix).Str("auth", auth).Str("url", cc.URL()).Msg("azure object store ready")
	return s, nil
}

// Container returns the container name.
func (s *Store) Container() string { return s.cfg.Container }

// Prefix returns the blob name prefix ("" or ending in "/") the store
// writes under.
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
	if len(s.prefix)+len(encodeName(key)) > objectstore.MaxKeyLen {
		// Azure limits the whole name, prefix included (and each "[" or
		// "\" takes two bytes, see encodeName).
		return fmt.Errorf("%w %q: longer than %d bytes after the prefix %q",
			objectstore.ErrInvalidKey, key, objectstore.MaxKeyLen-len(s.prefix), s.prefix)
	}
	return nil
}

func (s *Store) blob(key string) *blockblob.Client {
	return s.container.NewBlockBlobClient(s.prefix + encodeName(key))
}

// Put implements objectstore.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, opts objectstore.PutOptions) error {
	if err := s.check(ctx, key); err != nil {
		return err
	}
	uo := &blockblob.UploadStreamOptions{
		BlockSize:   s.cfg.BlockSize,
		Concurrency: s.cfg.UploadConcurrency,
		HTTPHeaders: &blob.HTTPHeaders{BlobContentType: ptr("application/octet-stream")},
	}
	if opts.Size >= 0 && opts.Size < uo.BlockSize {
		// One Put Blob; a buffer as large as the object is enough.
		uo.BlockSize = max(opts.Size+1, 1<<20)
	}
	if opts.IfNotExists {
		etagAny := azcore.ETagAny
		uo.AccessConditions = &blob.AccessConditions{
			ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfNoneMatch: &etagAny},
		}
	}
	body := &sizeReader{r: objectstore.ContextReader(ctx, r), want: opts.Size, key: key}
	_, err := s.blob(key).UploadStream(ctx, body, uo)
	if err == nil {
		return nil
	}
	if body.err != nil {
		// The body failed (or had the wrong size): UploadStream committed
		// nothing. Blocks it staged stay uncommitted and are collected.
		if cerr := ctx.Err(); cerr != nil && !errors.Is(body.err, cerr) {
			return fmt.Errorf("azure put %q: %w (%v)", key, cerr, body.err)
		}
		return fmt.Errorf("azure put %q: reading body: %w", key, body.err)
	}
	if ctx.Err() != nil {
		return s.mapErr(ctx, "put", key, err)
	}
	if opts.IfNotExists && (bloberror.HasCode(err, bloberror.BlobAlreadyExists, bloberror.ConditionNotMet) ||
		statusOf(err) == 412) {
		return fmt.Errorf("azure put %q: %w", key, objectstore.ErrExists)
	}
	if bloberror.HasCode(err, bloberror.InvalidBlockList, bloberror.InvalidBlobOrBlock) {
		// A concurrent writer of the same blob committed first, which
		// discarded the blocks this Put had staged.
		if opts.IfNotExists {
			if _, serr := s.Stat(ctx, key); serr == nil {
				return fmt.Errorf("azure put %q: lost to a concurrent writer: %w", key, objectstore.ErrExists)
			}
		}
		return fmt.Errorf("azure put %q: concurrent writer: %w", key, objectstore.Transient(err))
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
		return nil, fmt.Errorf("azure get %q: offset %d: %w", key, off, objectstore.ErrInvalidRange)
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
			return nil, fmt.Errorf("azure get %q: offset %d, size %d: %w", key, off, info.Size, objectstore.ErrInvalidRange)
		}
		return io.NopCloser(bytes.NewReader(nil)), nil
	}
	o := &blob.DownloadStreamOptions{}
	if off > 0 || length > 0 {
		o.Range = blob.HTTPRange{Offset: off, Count: max(length, 0)} // Count 0: to the end
	}
	resp, err := s.blob(key).DownloadStream(ctx, o)
	if err == nil {
		return &bodyReader{ctx: ctx, rc: resp.Body, key: key}, nil
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
	return nil, fmt.Errorf("azure get %q: offset %d, size %d: %w", key, off, info.Size, objectstore.ErrInvalidRange)
}

// Stat implements objectstore.Store.
func (s *Store) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	if err := s.check(ctx, key); err != nil {
		return objectstore.ObjectInfo{}, err
	}
	p, err := s.blob(key).GetProperties(ctx, nil)
	if err != nil {
		return objectstore.ObjectInfo{}, s.mapErr(ctx, "stat", key, err)
	}
	info := objectstore.ObjectInfo{Key: key}
	if p.ContentLength != nil {
		info.Size = *p.ContentLength
	}
	if p.LastModified != nil {
		info.ModTime = *p.LastModified
	}
	return info, nil
}

// List implements objectstore.Store. Azure lists blob names in ascending
// order, 5,000 a page; the pager pages.
func (s *Store) List(ctx context.Context, prefix string, fn func(objectstore.ObjectInfo) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return objectstore.ErrClosed
	}
	pager := s.container.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{
		Prefix: ptr(s.prefix + encodeName(listPrefix(prefix))),
	})
	for pager.More() {
		page, err := pager.NextPage(ctx)
		if err != nil {
			return s.mapErr(ctx, "list", prefix, err)
		}
		if page.Segment == nil {
			continue
		}
		for _, it := range page.Segment.BlobItems {
			if it == nil || it.Name == nil {
				continue
			}
			name, ok := strings.CutPrefix(*it.Name, s.prefix)
			key, ok2 := decodeName(name)
			if !ok || !ok2 || objectstore.ValidateKey(key) != nil || !strings.HasPrefix(key, prefix) {
				continue // not one of ours, or cut off by listPrefix
			}
			info := objectstore.ObjectInfo{Key: key}
			if p := it.Properties; p != nil {
				if p.ContentLength != nil {
					info.Size = *p.ContentLength
				}
				if p.LastModified != nil {
					info.ModTime = *p.LastModified
				}
			}
			if err := fn(info); err != nil {
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
	_, err := s.blob(key).Delete(ctx, nil)
	if err == nil || bloberror.HasCode(err, bloberror.BlobNotFound) {
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
	return nil
}

func ptr[T any](v T) *T { return &v }
