// Package server serves a Pageserver over gRPC (pageserverpb.PageService):
// batched, streaming GetPage, and the unary calls for writes, sizes, files,
// basebackup and timelines. It converts between wire types and Go types at
// the edge; errors cross as gRPC status codes (NotFound, DeadlineExceeded for
// WAL waits, OutOfRange below the GC cutoff) or, inside a GetPage batch, as
// per-page codes.
package server

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/pageserver"
	pb "github.com/stratadb/strata/core/pageserver/pageserverpb"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// Server implements pb.PageServiceServer over a Pageserver.
type Server struct {
	pb.UnimplementedPageServiceServer
	ps  *pageserver.Pageserver
	log zerolog.Logger

	getPageLatency prometheus.Histogram
	pages          prometheus.Counter
	batches        prometheus.Histogram
}

var _ pb.PageServiceServer = (*Server)(nil)

// New returns a Server. reg may be nil.
func New(ps *pageserver.Pageserver, log zerolog.Logger, reg prometheus.Registerer) *Server {
	s := &Server{
		ps:  ps,
		log: log,
		getPageLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "strata_pageserver_getpage_seconds", Help: "GetPage latency per page, server side.",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2, 20),
		}),
		pages:   prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_getpage_total", Help: "Pages requested with GetPage."}),
		batches: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "strata_pageserver_getpage_batch_size", Help: "Pages per GetPage batch.", Buckets: prometheus.ExponentialBuckets(1, 2, 10)}),
	}
	if reg != nil {
		reg.MustRegister(s.getPageLatency, s.pages, s.batches)
	}
	return s
}

// Register adds the service to a gRPC server.
func (s *Server) Register(g *grpc.Server) { pb.RegisterPageServiceServer(g, s) }

func tlID(b []byte) (pg.TimelineID, error) {
	var id pg.TimelineID
	if len(b) != 16 {
		return id, status.Errorf(codes.InvalidArgument, "timeline id of %d bytes", len(b))
	}
	copy(id[:], b)
	return id, nil
}

func (s *Server) timeline(b []byte) (*timeline.Timeline, error) {
	id, err := tlID(b)
	if err != nil {
		return nil, err
	}
	tl, err := s.ps.Timeline(id)
	if err != nil {
		return nil, toStatus(err)
	}
	return tl, nil
}

// toStatus maps engine errors to gRPC status errors.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	switch {
	case errors.Is(err, timeline.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, pageserver.ErrNotListed):
		// Before ErrNoTimeline, which it may wrap: ask again later.
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, pageserver.ErrNoTimeline):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, pageserver.ErrTimelineExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, pageserver.ErrStaleTerm):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, timeline.ErrWaitLSNTimeout):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, timeline.ErrBelowGCCutoff):
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, syscall.ENOSPC):
		return status.Error(codes.ResourceExhausted, "pageserver disk full: "+err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func code(err error) pb.Code {
	switch {
	case err == nil:
		return pb.Code_OK
	case errors.Is(err, timeline.ErrNotFound):
		return pb.Code_NOT_FOUND
	case errors.Is(err, timeline.ErrWaitLSNTimeout):
		return pb.Code_WAIT_TIMEOUT
	case errors.Is(err, timeline.ErrBelowGCCutoff):
		return pb.Code_BELOW_GC_CUTOFF
	}
	return pb.Code_ERROR
}

func relTag(r *pb.RelTag) pg.RelTag {
	if r == nil {
		return pg.RelTag{}
	}
	return pg.RelTag{Spc: r.Spc, DB: r.Db, Rel: r.Rel, Fork: pg.ForkNumber(r.Fork)}
}

func toRelTag(r pg.RelTag) *pb.RelTag {
	return &pb.RelTag{Spc: r.Spc, Db: r.DB, Rel: r.Rel, Fork: uint32(r.Fork)}
}

// GetPages implements the batched GetPage stream. Batches run concurrently
// (up to 8 per stream); each response carries its batch id.
func (s *Server) GetPages(stream pb.PageService_GetPagesServer) error {
	ctx := stream.Context()
	var sendMu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	defer wg.Wait()
	for {
		b, err := stream.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		sem <- struct{}{}
		wg.Add(1)
		go func(b *pb.GetPageBatch) {
			defer wg.Done()
			defer func() { <-sem }()
			resp := s.getBatch(ctx, b)
			sendMu.Lock()
			err := stream.Send(resp)
			sendMu.Unlock()
			if err != nil {
				s.log.Debug().Err(err).Msg("GetPages send")
			}
		}(b)
	}
}

func (s *Server) getBatch(ctx context.Context, b *pb.GetPageBatch) *pb.GetPageBatchResponse {
	resp := &pb.GetPageBatchResponse{Id: b.Id, Results: make([]*pb.PageResult, len(b.Pages)), Incarnation: s.ps.Incarnation()}
	s.batches.Observe(float64(len(b.Pages)))
	var tl *timeline.Timeline
	id, err := tlID(b.Timeline)
	if err == nil {
		tl, err = s.ps.Timeline(id) // raw error text: the client matches it
	}
	for i, r := range b.Pages {
		if err != nil {
			resp.Results[i] = &pb.PageResult{Code: pb.Code_ERROR, Error: err.Error()}
			continue
		}
		start := time.Now()
		pk := relTag(r.Rel).Page(r.Block)
		page, perr := tl.GetPage(ctx, pk, reqLSN(r.RequestLsn), pg.LSN(r.NotModifiedSince))
		s.getPageLatency.Observe(time.Since(start).Seconds())
		s.pages.Inc()
		res := &pb.PageResult{Code: code(perr), Page: page}
		if perr != nil {
			res.Error = perr.Error()
		}
		resp.Results[i] = res
	}
	return resp
}

// PutPages implements writeback page writes (gated by the commit LSN,
// fenced by term).
func (s *Server) PutPages(ctx context.Context, r *pb.PutPagesRequest) (*pb.PutPagesResponse, error) {
	id, err := tlID(r.Timeline)
	if err != nil {
		return nil, err
	}
	ws := make([]timeline.PageWrite, len(r.Pages))
	for i, p := range r.Pages {
		ws[i] = timeline.PageWrite{Page: relTag(p.Rel).Page(p.Block), W: pg.LSN(p.W), Data: p.Page}
	}
	sizes := make([]timeline.SizeWrite, len(r.Sizes))
	for i, sz := range r.Sizes {
		sizes[i] = timeline.SizeWrite{Rel: relTag(sz.Rel), Nblocks: sz.Nblocks, W: pg.LSN(sz.W), Drop: sz.Drop}
	}
	var d pg.LSN
	err = s.ps.Mutate(id, r.Term, func(tl *timeline.Timeline) error {
		var err error
		d, err = tl.PutPages(ctx, ws, sizes...)
		return err
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PutPagesResponse{DurableLsn: uint64(d), Incarnation: s.ps.Incarnation()}, nil
}

// ack is the answer of a mutation: the durable LSN and the incarnation.
func (s *Server) ack(id pg.TimelineID) (*pb.PutPagesResponse, error) {
	tl, err := s.ps.Timeline(id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PutPagesResponse{DurableLsn: uint64(tl.LSNs().Durable), Incarnation: s.ps.Incarnation()}, nil
}

// Nblocks returns sizes and existence of relation forks (batched).
func (s *Server) Nblocks(ctx context.Context, r *pb.NblocksRequest) (*pb.NblocksResponse, error) {
	tl, err := s.timeline(r.Timeline)
	if err != nil {
		return nil, err
	}
	if err := tl.WaitLSN(ctx, pg.LSN(r.NotModifiedSince)); err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.NblocksResponse{}
	for _, rt := range r.Rels {
		n, ok, err := tl.Nblocks(ctx, relTag(rt), reqLSN(r.RequestLsn))
		if err != nil {
			return nil, toStatus(err)
		}
		resp.Exists = append(resp.Exists, ok)
		resp.Nblocks = append(resp.Nblocks, n)
	}
	return resp, nil
}

// DbSize returns the total size of a database's relations.
func (s *Server) DbSize(ctx context.Context, r *pb.DbSizeRequest) (*pb.DbSizeResponse, error) {
	tl, err := s.timeline(r.Timeline)
	if err != nil {
		return nil, err
	}
	n, err := tl.DBSize(ctx, r.Spc, r.Db, reqLSN(r.RequestLsn))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.DbSizeResponse{Bytes: n}, nil
}

// RelOp sets a relation fork's size (create, truncate) or drops it (gated,
// fenced by term).
func (s *Server) RelOp(ctx context.Context, r *pb.RelOpRequest) (*pb.PutPagesResponse, error) {
	id, err := tlID(r.Timeline)
	if err != nil {
		return nil, err
	}
	err = s.ps.Mutate(id, r.Term, func(tl *timeline.Timeline) error {
		switch r.Op {
		case pb.RelOpRequest_SET_SIZE:
			return tl.SetRelSize(ctx, relTag(r.Rel), r.Nblocks, pg.LSN(r.W))
		case pb.RelOpRequest_DROP:
			return tl.DropRel(ctx, relTag(r.Rel), pg.LSN(r.W))
		}
		return status.Errorf(codes.InvalidArgument, "rel op %v", r.Op)
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return s.ack(id)
}

// GetFile returns a non-relation file's content.
func (s *Server) GetFile(ctx context.Context, r *pb.GetFileRequest) (*pb.GetFileResponse, error) {
	tl, err := s.timeline(r.Timeline)
	if err != nil {
		return nil, err
	}
	d, err := tl.ReadFile(ctx, r.Path, reqLSN(r.RequestLsn))
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.GetFileResponse{Data: d, Incarnation: s.ps.Incarnation()}, nil
}

// FileOp writes, truncates, replaces or unlinks a non-relation file
// (gated, fenced by term).
func (s *Server) FileOp(ctx context.Context, r *pb.FileOpRequest) (*pb.PutPagesResponse, error) {
	id, err := tlID(r.Timeline)
	if err != nil {
		return nil, err
	}
	err = s.ps.Mutate(id, r.Term, func(tl *timeline.Timeline) error {
		switch r.Op {
		case pb.FileOpRequest_WRITE:
			return tl.WriteFile(ctx, r.Path, r.Offset, r.Data, pg.LSN(r.W))
		case pb.FileOpRequest_TRUNCATE:
			return tl.TruncateFile(ctx, r.Path, r.Size, pg.LSN(r.W))
		case pb.FileOpRequest_UNLINK:
			return tl.UnlinkFile(ctx, r.Path, pg.LSN(r.W))
		case pb.FileOpRequest_REPLACE:
			return tl.ReplaceFile(ctx, r.Path, r.Data, pg.LSN(r.W))
		}
		return status.Errorf(codes.InvalidArgument, "file op %v", r.Op)
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return s.ack(id)
}

// ListFiles lists non-relation files and relation forks at an LSN.
func (s *Server) ListFiles(ctx context.Context, r *pb.ListFilesRequest) (*pb.ListFilesResponse, error) {
	tl, err := s.timeline(r.Timeline)
	if err != nil {
		return nil, err
	}
	fs, err := tl.ListFiles(ctx, reqLSN(r.RequestLsn))
	if err != nil {
		return nil, toStatus(err)
	}
	rels, err := tl.ListRels(ctx, relsRange, reqLSN(r.RequestLsn))
	if err != nil {
		return nil, toStatus(err)
	}
	resp := &pb.ListFilesResponse{}
	for _, f := range fs {
		resp.Files = append(resp.Files, &pb.FileInfo{Path: f.Path, Size: f.Size})
	}
	for _, rt := range rels {
		resp.Rels = append(resp.Rels, toRelTag(rt))
	}
	return resp, nil
}

type chunkWriter struct {
	stream pb.PageService_BasebackupServer
}

func (w chunkWriter) Write(p []byte) (int, error) {
	for off := 0; off < len(p); off += 1 << 20 {
		end := min(len(p), off+1<<20)
		if err := w.stream.Send(&pb.Chunk{Data: p[off:end]}); err != nil {
			return off, err
		}
	}
	return len(p), nil
}

// Basebackup streams a tar of the data directory at an LSN.
func (s *Server) Basebackup(r *pb.BasebackupRequest, stream pb.PageService_BasebackupServer) error {
	tl, err := s.timeline(r.Timeline)
	if err != nil {
		return err
	}
	bw := newBufferedChunks(chunkWriter{stream})
	if err := pageserver.Basebackup(stream.Context(), tl, reqLSN(r.Lsn), bw); err != nil {
		return toStatus(err)
	}
	return bw.Flush()
}

// CreateTimeline creates a root timeline, or a branch when ancestor is set.
func (s *Server) CreateTimeline(ctx context.Context, r *pb.TimelineRequest) (*pb.TimelineInfo, error) {
	id, err := tlID(r.Timeline)
	if err != nil {
		return nil, err
	}
	var tl *timeline.Timeline
	if len(r.Ancestor) > 0 {
		anc, err := tlID(r.Ancestor)
		if err != nil {
			return nil, err
		}
		tl, err = s.ps.Branch(ctx, anc, id, pg.LSN(r.AncestorLsn))
		if err != nil {
			return nil, toStatus(err)
		}
	} else if tl, err = s.ps.CreateTimeline(ctx, id); err != nil {
		return nil, toStatus(err)
	}
	return s.info(tl), nil
}

func (s *Server) info(tl *timeline.Timeline) *pb.TimelineInfo {
	id := tl.ID()
	l := tl.LSNs()
	term, _ := s.ps.Term(id)
	i := &pb.TimelineInfo{
		Timeline: id[:], LastRecordLsn: uint64(l.LastRecord), CommitLsn: uint64(l.Commit),
		DurableLsn: uint64(l.Durable), RemoteConsistentLsn: uint64(l.RemoteConsistent),
		GcCutoff: uint64(l.GCCutoff), Pending: uint32(l.Pending), Layers: uint32(len(tl.Layers())),
		Incarnation: s.ps.Incarnation(), Term: term, Lease: uint64(l.Lease),
	}
	if a, at := tl.Ancestor(); a != nil {
		aid := a.ID()
		i.Ancestor, i.AncestorLsn = aid[:], uint64(at)
	}
	u := tl.UploadTrouble()
	i.UploadFailingSinceMs, i.UploadFailures, i.UploadError = u.SinceMillis(), uint32(u.Failures), u.Err
	return i
}

// ListTimelines lists the timelines with their LSNs.
func (s *Server) ListTimelines(ctx context.Context, _ *pb.ListTimelinesRequest) (*pb.ListTimelinesResponse, error) {
	resp := &pb.ListTimelinesResponse{}
	for _, tl := range s.ps.Timelines() {
		resp.Timelines = append(resp.Timelines, s.info(tl))
	}
	return resp, nil
}

// AdvanceCommitLSN raises a timeline's commit LSN (when the pageserver
// does not take it from the safekeepers directly).
func (s *Server) AdvanceCommitLSN(ctx context.Context, r *pb.AdvanceCommitLSNRequest) (*pb.Empty, error) {
	id, err := tlID(r.Timeline)
	if err != nil {
		return nil, err
	}
	if err := s.ps.AdvanceCommitLSN(id, pg.LSN(r.CommitLsn)); err != nil {
		return nil, toStatus(err)
	}
	return &pb.Empty{}, nil
}

// BeginTerm fences older computes of a timeline and drops the pending
// versions above the new term's durable end.
func (s *Server) BeginTerm(ctx context.Context, r *pb.BeginTermRequest) (*pb.BeginTermResponse, error) {
	id, err := tlID(r.Timeline)
	if err != nil {
		return nil, err
	}
	n, err := s.ps.BeginTerm(id, r.Term, pg.LSN(r.DurableEnd))
	if err != nil {
		return nil, toStatus(err)
	}
	a, err := s.ack(id)
	if err != nil {
		return nil, err
	}
	return &pb.BeginTermResponse{Dropped: uint32(n), DurableLsn: a.DurableLsn, Incarnation: a.Incarnation}, nil
}

// GetDurable returns the timeline's durable LSN and the incarnation.
func (s *Server) GetDurable(ctx context.Context, r *pb.GetDurableRequest) (*pb.PutPagesResponse, error) {
	id, err := tlID(r.Timeline)
	if err != nil {
		return nil, err
	}
	return s.ack(id)
}

// reqLSN maps a request LSN to the engine's: 0 (unset) means latest.
func reqLSN(x uint64) pg.LSN {
	if x == 0 {
		return timeline.LatestLSN
	}
	return pg.LSN(x)
}

// LeaseLSN holds GC of a timeline below an LSN for a while (a restore
// reading the history at that LSN).
func (s *Server) LeaseLSN(ctx context.Context, r *pb.LeaseLSNRequest) (*pb.LeaseLSNResponse, error) {
	tl, err := s.timeline(r.Timeline)
	if err != nil {
		return nil, err
	}
	end, err := tl.Lease(pg.LSN(r.Lsn), r.Holder, time.Duration(r.TtlMs)*time.Millisecond)
	if err != nil {
		if errors.Is(err, timeline.ErrBelowGCCutoff) {
			return nil, toStatus(err)
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp := &pb.LeaseLSNResponse{GcCutoff: uint64(tl.LSNs().GCCutoff)}
	if !end.IsZero() {
		resp.ExpiresUnixMs = end.UnixMilli()
	}
	return resp, nil
}
