package objectstore

import (
	"context"
	"errors"
	"io"
	"sync"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/sdk/internal/objectstorepb"
)

// grpcServer serves one Store (opened by Configure) to the host.
type grpcServer struct {
	objectstorepb.UnimplementedObjectStoreServer

	factory PluginFactory
	log     zerolog.Logger
	bufs    sync.Pool // of *[]byte, chunkSize long

	mu    sync.Mutex
	store Store // nil until Configure
}

func newGRPCServer(factory PluginFactory, log zerolog.Logger) *grpcServer {
	s := &grpcServer{factory: factory, log: log}
	s.bufs.New = func() any { b := make([]byte, chunkSize); return &b }
	return s
}

func (s *grpcServer) opened() (Store, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.store == nil {
		return nil, status.Error(codes.Internal, "objectstore plugin: Configure was not called")
	}
	return s.store, nil
}

func (s *grpcServer) Configure(_ context.Context, req *objectstorepb.ConfigureRequest) (*objectstorepb.ConfigureResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.store != nil {
		return nil, status.Error(codes.Internal, "objectstore plugin: already configured")
	}
	st, err := s.factory(req.GetConfigJson(), s.log)
	if err != nil {
		// Keep the factory's own error kind if it has one, else Internal
		// (a bad config is not a bad key).
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codes.Internal, "objectstore plugin: opening the store: "+err.Error())
	}
	s.store = st
	s.log.Debug().Msg("objectstore plugin configured")
	return &objectstorepb.ConfigureResponse{}, nil
}

// putReader turns the chunks of a Put stream into an io.Reader.
type putReader struct {
	stream grpc.ClientStreamingServer[objectstorepb.PutRequest, objectstorepb.PutResponse]
	buf    []byte
	err    error
}

func (r *putReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.err != nil {
			return 0, r.err
		}
		msg, err := r.stream.Recv()
		if err != nil {
			// io.EOF: the host half-closed the stream after the last
			// chunk. Anything else (a cancelled stream) aborts the Put.
			r.err = err
			return 0, err
		}
		chunk, ok := msg.GetMsg().(*objectstorepb.PutRequest_Chunk)
		if !ok {
			r.err = status.Error(codes.Internal, "objectstore plugin: Put header sent twice")
			return 0, r.err
		}
		r.buf = chunk.Chunk
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

func (s *grpcServer) Put(stream grpc.ClientStreamingServer[objectstorepb.PutRequest, objectstorepb.PutResponse]) error {
	st, err := s.opened()
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return status.Error(codes.Internal, "objectstore plugin: Put stream does not start with a header")
	}
	r := &putReader{stream: stream}
	if err := st.Put(stream.Context(), string(h.GetKey()), r, PutOptions{IfNotExists: h.GetIfNotExists(), Size: h.GetSize()}); err != nil {
		return errorMap.ToStatus(err)
	}
	return stream.SendAndClose(&objectstorepb.PutResponse{})
}

func (s *grpcServer) Get(req *objectstorepb.GetRequest, stream grpc.ServerStreamingServer[objectstorepb.GetResponse]) error {
	st, err := s.opened()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	var rc io.ReadCloser
	if req.GetRanged() {
		rc, err = st.GetRange(ctx, string(req.GetKey()), req.GetOffset(), req.GetLength())
	} else {
		rc, err = st.Get(ctx, string(req.GetKey()))
	}
	if err != nil {
		return errorMap.ToStatus(err)
	}
	defer func() { _ = rc.Close() }()
	bp := s.bufs.Get().(*[]byte)
	defer s.bufs.Put(bp)
	buf := *bp
	// The first message goes out as soon as the object is open (even when
	// it is empty), so that the host's Get returns only once the object is
	// known to exist.
	for first := true; ; first = false {
		n, rerr := io.ReadFull(rc, buf)
		if n > 0 || first {
			// Send marshals the message before it returns: buf is free again.
			if err := stream.Send(&objectstorepb.GetResponse{Chunk: buf[:n]}); err != nil {
				return err
			}
		}
		switch {
		case rerr == nil:
		case errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF):
			return nil
		default:
			return errorMap.ToStatus(rerr)
		}
	}
}

func (s *grpcServer) Stat(ctx context.Context, req *objectstorepb.StatRequest) (*objectstorepb.StatResponse, error) {
	st, err := s.opened()
	if err != nil {
		return nil, err
	}
	oi, err := st.Stat(ctx, string(req.GetKey()))
	if err != nil {
		return nil, errorMap.ToStatus(err)
	}
	return &objectstorepb.StatResponse{Info: infoToProto(oi)}, nil
}

func (s *grpcServer) List(req *objectstorepb.ListRequest, stream grpc.ServerStreamingServer[objectstorepb.ListResponse]) error {
	st, err := s.opened()
	if err != nil {
		return err
	}
	batch := make([]*objectstorepb.ObjectInfo, 0, listBatch)
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		err := stream.Send(&objectstorepb.ListResponse{Objects: batch})
		batch = make([]*objectstorepb.ObjectInfo, 0, listBatch)
		return err
	}
	err = st.List(stream.Context(), string(req.GetPrefix()), func(oi ObjectInfo) error {
		batch = append(batch, infoToProto(oi))
		if len(batch) == listBatch {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	return errorMap.ToStatus(err)
}

func (s *grpcServer) Delete(ctx context.Context, req *objectstorepb.DeleteRequest) (*objectstorepb.DeleteResponse, error) {
	st, err := s.opened()
	if err != nil {
		return nil, err
	}
	if err := st.Delete(ctx, string(req.GetKey())); err != nil {
		return nil, errorMap.ToStatus(err)
	}
	return &objectstorepb.DeleteResponse{}, nil
}

func (s *grpcServer) Close(context.Context, *objectstorepb.CloseRequest) (*objectstorepb.CloseResponse, error) {
	st, err := s.opened()
	if err != nil {
		return nil, err
	}
	if err := st.Close(); err != nil {
		return nil, errorMap.ToStatus(err)
	}
	return &objectstorepb.CloseResponse{}, nil
}
