package s3

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/stratadb/strata/sdk/objectstore"
)

// errorStatus returns the HTTP status and S3 error code of an SDK error
// (0 and "" when it carries none).
func errorStatus(err error) (status int, code string) {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		status = re.HTTPStatusCode()
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		code = ae.ErrorCode()
	}
	return status, code
}

// transientCodes are S3 error codes worth repeating the request for.
var transientCodes = map[string]bool{
	"SlowDown":                      true,
	"Throttling":                    true,
	"ThrottlingException":           true,
	"RequestTimeout":                true,
	"RequestTimeTooSkewed":          true,
	"InternalError":                 true,
	"ServiceUnavailable":            true,
	"OperationAborted":              true,
	"RequestLimitExceeded":          true,
	"TooManyRequestsException":      true,
	"ProvisionedThroughputExceeded": true,
}

// mapErr turns an SDK error into the objectstore contract's errors, keeping
// the SDK error in the chain: context cancellation first, then not found,
// invalid range, and transient failures (throttling, 5xx, network).
func (s *Store) mapErr(ctx context.Context, op, key string, err error) error {
	if err == nil {
		return nil
	}
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("s3 %s %q: %w", op, key, err)
		}
		return fmt.Errorf("s3 %s %q: %w (%v)", op, key, cerr, err)
	}
	status, code := errorStatus(err)
	switch {
	case code == "NoSuchBucket":
		where := ""
		if s.cfg.Endpoint != "" {
			where = " at " + s.cfg.Endpoint
		}
		return fmt.Errorf("s3 %s %q: bucket %q does not exist%s (create it; on a test server or emulator, objectstore.s3.create_bucket: true makes it): %w", op, key, s.cfg.Bucket, where, err)
	case code == "NoSuchKey" || (status == 404 && code != "NoSuchBucket" && code != "NoSuchUpload"):
		return fmt.Errorf("s3 %s %q: %w", op, key, objectstore.ErrNotFound)
	case code == "InvalidRange" || status == 416:
		return fmt.Errorf("s3 %s %q: %w (%v)", op, key, objectstore.ErrInvalidRange, err)
	case isTransient(err, status, code):
		return fmt.Errorf("s3 %s %q: %w", op, key, objectstore.Transient(err))
	}
	return fmt.Errorf("s3 %s %q: %w", op, key, err)
}

func isTransient(err error, status int, code string) bool {
	if status == 429 || status >= 500 || transientCodes[code] {
		return true
	}
	var se *smithyhttp.RequestSendError
	if errors.As(err, &se) {
		return true
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return true
	}
	return errors.Is(err, io.ErrUnexpectedEOF)
}

// sizeReader records the first error of its reader other than EOF, and
// fails the read that reaches EOF early or runs past want bytes when
// want >= 0 (PutOptions.Size). A failed read aborts the upload, so a body
// of the wrong length never becomes visible.
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

// bodyReader streams a GetObject body: it stops at ctx's end and marks
// network failures in the middle of the body as transient.
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
		return n, fmt.Errorf("s3 get %q: %w (%v)", b.key, cerr, err)
	}
	return n, fmt.Errorf("s3 get %q: reading body: %w", b.key, objectstore.Transient(err))
}

func (b *bodyReader) Close() error { return b.rc.Close() }
