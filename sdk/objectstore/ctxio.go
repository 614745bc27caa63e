package objectstore

import (
	"context"
	"io"
)

// ContextReader returns a reader that reads from r until ctx is done, and
// then fails every Read with ctx.Err(). Implementations use it to make a
// streamed Put or Get honour cancellation between chunks.
func ContextReader(ctx context.Context, r io.Reader) io.Reader {
	return &ctxReader{ctx: ctx, r: r}
}

// ContextReadCloser is ContextReader for a ReadCloser; Close closes rc.
func ContextReadCloser(ctx context.Context, rc io.ReadCloser) io.ReadCloser {
	return &ctxReadCloser{ctxReader{ctx: ctx, r: rc}, rc}
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

type ctxReadCloser struct {
	ctxReader
	c io.Closer
}

func (c *ctxReadCloser) Close() error { return c.c.Close() }
