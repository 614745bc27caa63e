package azure

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"

	"github.com/stratadb/strata/sdk/objectstore"
)

// statusOf returns the HTTP status of an Azure response error, or 0.
func statusOf(err error) int {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return re.StatusCode
	}
	return 0
}

// mapErr turns an SDK error into the objectstore contract's errors,
// keeping it in the chain: context cancellation first, then not found,
// invalid range, and transient failures (408, 429, 5xx, network).
func (s *Store) mapErr(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("azure %s %q: %w", op, key, err)
		}
		return fmt.Errorf("azure %s %q: %w (%v)", op, key, cerr, err)
	}
	status := statusOf(err)
	switch {
	case bloberror.HasCode(err, bloberror.ContainerNotFound):
		// The SDK's own text is a dozen lines of HTTP exchange; the chain
		// keeps it.
		return &shortError{
			msg: fmt.Sprintf("azure %s %q: container %q does not exist (create it; on an emulator, objectstore.azure.create_container: true makes it): 404 ContainerNotFound", op, key, s.cfg.Container),
			err: err,
		}
	case bloberror.HasCode(err, bloberror.BlobNotFound) || (status == 404 && !bloberror.HasCode(err, bloberror.ContainerNotFound)):
		return fmt.Errorf("azure %s %q: %w", op, key, objectstore.ErrNotFound)
	case status == 416 || bloberror.HasCode(err, bloberror.InvalidRange):
		return fmt.Errorf("azure %s %q: %w (%v)", op, key, objectstore.ErrInvalidRange, err)
	case isTransient(err, status):
		return fmt.Errorf("azure %s %q: %w", op, key, objectstore.Transient(err))
	}
	return fmt.Errorf("azure %s %q: %w", op, key, err)
}

func isTransient(err error, status int) bool {
	if status == 408 || status == 429 || status >= 500 {
		return true
	}
	if bloberror.HasCode(err, bloberror.ServerBusy, bloberror.OperationTimedOut, bloberror.InternalError) {
		return true
	}
	var ne net.Error // *url.Error, from every failed HTTP exchange, is one
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF)
}

// sizeReader records the first error of its reader other than EOF, and
// turns an EOF at the wrong length (PutOptions.Size, when want >= 0) into
// an error, so that the upload is not committed.
type sizeReader struct {
	r    io.Reader
	want int64
	n    int64
	key  string
	err  error
}

func (z *sizeReader) Read(p []byte) (int, error) {
	n, err := z.r.Read(p)
	z.n += int64(n)
	switch {
	case err != nil && err != io.EOF:
	case z.want >= 0 && z.n > z.want:
		err = fmt.Errorf("body is longer than PutOptions.Size %d", z.want)
	case err == io.EOF && z.want >= 0 && z.n != z.want:
		err = fmt.Errorf("body has %d bytes, PutOptions.Size said %d", z.n, z.want)
	}
	if err != nil && err != io.EOF && z.err == nil {
		z.err = err
	}
	return n, err
}

// bodyReader streams a download: it stops at ctx's end and marks failures
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
		return n, fmt.Errorf("azure get %q: %w (%v)", b.key, cerr, err)
	}
	return n, fmt.Errorf("azure get %q: reading body: %w", b.key, objectstore.Transient(err))
}

func (b *bodyReader) Close() error { return b.rc.Close() }

// shortError says msg and unwraps to err.
type shortError struct {
	msg string
	err error
}

func (e *shortError) Error() string { return e.msg }
func (e *shortError) Unwrap() error { return e.err }
