package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"

	"github.com/stratadb/strata/sdk/internal/objectstorepb"
)

// GRPCClient is the host side of the shim: a Store whose calls run in a
// plugin process. It is safe for concurrent use. Errors come back as the
// contract's sentinels (see errorMap); a broken connection to the plugin
// is ErrTransient (gRPC Unavailable). It does not notice by itself that the
// plugin process died or restart it: core/pluginhost does.
type GRPCClient struct {
	rpc  objectstorepb.ObjectStoreClient
	bufs sync.Pool // of *[]byte, chunkSize long
}

var _ Store = (*GRPCClient)(nil)

// NewGRPCClient returns a client of the object store service on conn.
func NewGRPCClient(conn grpc.ClientConnInterface) *GRPCClient {
	c := &GRPCClient{rpc: objectstorepb.NewObjectStoreClient(conn)}
	c.bufs.New = func() any { b := make([]byte, chunkSize); return &b }
	return c
}

// Configure passes the plugin its config section (JSON) and makes it open
// its store. It must be called once, before any other call.
func (c *GRPCClient) Configure(ctx context.Context, configJSON []byte) error {
	_, err := c.rpc.Configure(ctx, &objectstorepb.ConfigureRequest{ConfigJson: configJSON})
	return errorMap.FromStatus(err)
}

// fromStatus maps an RPC error and makes sure that an error caused by the
// caller's context matches ctx.Err().
func fromStatus(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	mapped := errorMap.FromStatus(err)
	if cerr := ctx.Err(); cerr != nil && !errors.Is(mapped, cerr) {
		return fmt.Errorf("%w (%v)", cerr, mapped)
	}
	return mapped
}

// Put streams r to the plugin in chunks of at most 1 MiB. If reading r
// fails, the stream is cancelled and the plugin stores nothing.
func (c *GRPCClient) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.Put(sctx)
	if err != nil {
		return fromStatus(ctx, err)
	}
	hdr := &objectstorepb.PutRequest{Msg: &objectstorepb.PutRequest_Header{Header: &objectstorepb.PutHeader{
		Key: []byte(key), IfNotExists: opts.IfNotExists, Size: opts.Size,
	}}}
	// A Send that fails with io.EOF means the plugin ended the call (for
	// example: invalid key); CloseAndRecv below returns its status.
	if err := stream.Send(hdr); err != nil && !errors.Is(err, io.EOF) {
		return fromStatus(ctx, err)
	} else if err == nil {
		bp := c.bufs.Get().(*[]byte)
		defer c.bufs.Put(bp)
		buf := *bp
		chunk := &objectstorepb.PutRequest_Chunk{}
		msg := &objectstorepb.PutRequest{Msg: chunk}
	send:
		for {
			n, rerr := io.ReadFull(r, buf)
			if n > 0 {
				chunk.Chunk = buf[:n]
				if err := stream.Send(msg); errors.Is(err, io.EOF) {
					break send
				} else if err != nil {
					return fromStatus(ctx, err)
				}
			}
			switch {
			case rerr == nil:
			case errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF):
				break send
			default:
				cancel() // the plugin sees a cancelled stream and aborts the Put
				return fmt.Errorf("objectstore: put %q: reading the source: %w", key, rerr)
			}
		}
	}
	_, err = stream.CloseAndRecv()
	return fromStatus(ctx, err)
}

// Get returns a reader that streams the object from the plugin.
func (c *GRPCClient) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return c.get(ctx, &objectstorepb.GetRequest{Key: []byte(key)})
}

// GetRange returns a reader that streams a range of the object.
func (c *GRPCClient) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	return c.get(ctx, &objectstorepb.GetRequest{Key: []byte(key), Ranged: true, Offset: off, Length: length})
}

func (c *GRPCClient) get(ctx context.Context, req *objectstorepb.GetRequest) (io.ReadCloser, error) {
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.rpc.Get(sctx, req)
	if err != nil {
		cancel()
		return nil, fromStatus(ctx, err)
	}
	// The plugin sends the first message once the object is open: wait for
	// it so that a missing key fails here and not at the first Read.
	first, err := stream.Recv()
	if err != nil {
		cancel()
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("objectstore: get %q: plugin ended the stream without a reply", string(req.GetKey()))
		}
		return nil, fromStatus(ctx, err)
	}
	return &getReader{ctx: ctx, cancel: cancel, stream: stream, buf: first.GetChunk()}, nil
}

// getReader reads a Get stream. It is not safe for concurrent use (like
// any io.Reader).
type getReader struct {
	ctx    context.Context
	cancel context.CancelFunc
	stream grpc.ServerStreamingClient[objectstorepb.GetResponse]
	buf    []byte
	err    error
}

func (g *getReader) Read(p []byte) (int, error) {
	for len(g.buf) == 0 {
		if g.err != nil {
			return 0, g.err
		}
		msg, err := g.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				g.err = io.EOF
			} else {
				g.err = fromStatus(g.ctx, err)
			}
			g.cancel()
			return 0, g.err
		}
		g.buf = msg.GetChunk()
	}
	n := copy(p, g.buf)
	g.buf = g.buf[n:]
	return n, nil
}

// Close ends the stream; the plugin closes its reader.
func (g *getReader) Close() error {
	g.cancel()
	if g.err == nil {
		g.err = errors.New("objectstore: read after Close")
	}
	return nil
}

// Stat returns the object's metadata.
func (c *GRPCClient) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	resp, err := c.rpc.Stat(ctx, &objectstorepb.StatRequest{Key: []byte(key)})
	if err != nil {
		return ObjectInfo{}, fromStatus(ctx, err)
	}
	return infoFromProto(resp.GetInfo()), nil
}

// List calls fn for every object under prefix as the plugin streams them.
// An error from fn stops the stream and is returned unchanged.
func (c *GRPCClient) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := c.rpc.List(sctx, &objectstorepb.ListRequest{Prefix: []byte(prefix)})
	if err != nil {
		return fromStatus(ctx, err)
	}
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fromStatus(ctx, err)
		}
		for _, pi := range msg.GetObjects() {
			if err := fn(infoFromProto(pi)); err != nil {
				return err
			}
		}
	}
}

// Delete removes the object.
func (c *GRPCClient) Delete(ctx context.Context, key string) error {
	_, err := c.rpc.Delete(ctx, &objectstorepb.DeleteRequest{Key: []byte(key)})
	return fromStatus(ctx, err)
}

// Close closes the plugin's store. It does not stop the plugin process
// (core/pluginhost does) nor close the connection.
func (c *GRPCClient) Close() error {
	_, err := c.rpc.Close(context.Background(), &objectstorepb.CloseRequest{})
	return errorMap.FromStatus(err)
}
