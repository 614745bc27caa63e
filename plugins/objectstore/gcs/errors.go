package gcs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"

	"github.com/stratadb/strata/sdk/objectstore"
)

// httpStatus returns the HTTP status of a GCS API error, or 0.
func httpStatus(err error) int {
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		return ge.Code
	}
	return 0
}

// mapErr turns a client error into the objectstore contract's errors,
// keeping it in the chain: context cancellation first, then not found,
// invalid range, and transient failures (429, 5xx, network).
func (s *Store) mapErr(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("gcs %s %q: %w", op, key, err)
		}
		return fmt.Errorf("gcs %s %q: %w (%v)", op, key, cerr, err)
	}
	status := httpStatus(err)
	switch {
	case errors.Is(err, storage.ErrBucketNotExist):
		return fmt.Errorf("gcs %s %q: bucket %q does not exist (create it; on an emulator, objectstore.gcs.create_bucket: true makes it): %w", op, key, s.cfg.Bucket, err)
	case errors.Is(err, storage.ErrObjectNotExist):
		return fmt.Errorf("gcs %s %q: %w", op, key, objectstore.ErrNotFound)
	case status == 416:
		return fmt.Errorf("gcs %s %q: %w (%v)", op, key, objectstore.ErrInvalidRange, err)
	case isTransient(err, status):
		return fmt.Errorf("gcs %s %q: %w", op, key, objectstore.Transient(err))
	}
	return fmt.Errorf("gcs %s %q: %w", op, key, err)
}

func isTransient(err error, status int) bool {
	if status == 408 || status == 429 || status >= 500 {
		return true
	}
	var ne net.Error // *url.Error, from every failed HTTP exchange, is one
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF)
}

// readRecorder remembers the error its reader returned (other than EOF),
// so that Put can tell a failing body from a failing upload.
type readRecorder struct {
	r   io.Reader
	err error
}

func (rr *readRecorder) Read(p []byte) (int, error) {
	n, err := rr.r.Read(p)
	if err != nil && err != io.EOF {
		rr.err = err
	}
	return n, err
}

// bodyReader streams an object: it stops at ctx's end and marks failures
// in the middle of the body as transient.
type bodyReader struct {
	ctx context.Context
	rc  io.ReadCloser
	key string
}

func (b *bodyReader) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := b.rc.Read(p)
	if err == nil || err == io.EOF {
		return n, err
	}
	if cerr := b.ctx.Err(); cerr != nil {
		return n, fmt.Errorf("gcs get %q: %w (%v)", b.key, cerr, err)
	}
	return n, fmt.Errorf("gcs get %q: reading body: %w", b.key, objectstore.Transient(err))
}

func (b *bodyReader) Close() error { return b.rc.Close() }
