// Package server is the safekeeper's gRPC edge: the service (status, the
// election calls, the WAL stream with consumer feedback) over a Backend, and
// the Client that the compute agent, the pageserver, peers and `strata wal
// fetch` use. Wire types never leave this package; errors cross as status
// codes and come back as the same sentinels (election.ErrStaleTerm,
// walstore.ErrCorrupt, walstore.ErrNotHeld).
package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/safekeeper/election"
	pb "github.com/stratadb/strata/core/safekeeper/safekeeperpb"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/pg"
)

// MaxChunk is the largest WAL chunk in one message.
const MaxChunk = 256 << 10

// Status is a safekeeper's state as seen from outside.
type Status struct {
	ID          string
	Term        uint64
	ComputeID   string
	Accepted    bool
	History     election.History
	StartLSN    pg.LSN
	FlushLSN    pg.LSN
	CommitLSN   pg.LSN
	ArchivedLSN pg.LSN
	SystemID    uint64
	Timeline    pg.PGTimeline
	SegmentSize uint64
	// Consumers is the WAL consumers' progress it knows (by consumer ID),
	// from the consumers or from peers.
	Consumers map[string]Feedback
	// Archive: the current run of failed archive steps (zero when the
	// last one succeeded).
	Archive trouble.Run
}

// Feedback is a WAL consumer's progress.
type Feedback struct {
	Received, Durable, Uploaded pg.LSN
}

// Max is the higher of f's and o's figures, each on its own (progress
// reported at different times, or by different members, only advances).
func (f Feedback) Max(o Feedback) Feedback {
	return Feedback{Received: max(f.Received, o.Received), Durable: max(f.Durable, o.Durable), Uploaded: max(f.Uploaded, o.Uploaded)}
}

// Bound says how far a WAL stream may go.
type Bound int

// Stream bounds.
const (
	BoundCommit Bound = iota // the commit LSN (quorum-durable): pageservers
	BoundFlush               // the local flush LSN: peers, wal fetch
)

// Backend is what the service serves. Implementations are safe for
// concurrent use.
type Backend interface {
	Status() Status
	// Vote handles a vote; the vote is durable when it returns.
	Vote(ctx context.Context, req election.VoteRequest) (election.VoteResponse, error)
	// Accept applies an elected proposer's message (truncate, catch up,
	// follow postgres) and returns the flush LSN, which then equals req.Start.
	Accept(ctx context.Context, req election.AcceptRequest, postgres string) (pg.LSN, error)
	Store() *walstore.Store
	// CommitLSN and CommitNotify: the quorum-durable LSN, and a channel
	// closed when it next advances. Only a caller that waits for the commit
	// LSN calls CommitNotify: it tells the backend that somebody does, and
	// a safekeeper then learns its peers' flush LSNs promptly.
	CommitLSN() pg.LSN
	CommitNotify() <-chan struct{}
	// Feedback records a consumer's progress.
	Feedback(consumer string, fb Feedback)
	// Sent counts WAL bytes sent.
	Sent(n int)
}

// Archive is an optional Backend interface: a backend whose WAL archive
// holds WAL its store removed. A stream from below the store's start LSN
// (a pageserver replaced on an empty disk resumes where the object store's
// layers end, which can be older than what the safekeepers keep) is served
// from the archive up to the start LSN, then from the store.
type Archive interface {
	// ArchivedSegment returns the whole archived segment that holds lsn and
	// the segment's first LSN; walstore.ErrNotHeld when the archive does
	// not hold it.
	ArchivedSegment(ctx context.Context, lsn pg.LSN) (pg.LSN, []byte, error)
}

type service struct {
	pb.UnimplementedSafekeeperServer
	b Backend
}

// ServerOptions are the gRPC server options a safekeeper uses (larger flow
// control windows for WAL streaming).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(8 << 20), grpc.InitialWindowSize(4 << 20), grpc.InitialConnWindowSize(8 << 20)}
}

// Register adds the safekeeper service to s.
func Register(s *grpc.Server, b Backend) { pb.RegisterSafekeeperServer(s, &service{b: b}) }

func toErr(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, election.ErrStaleTerm):
		return status.Error(codes.Aborted, err.Error())
	case errors.Is(err, election.ErrNotVoted):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, walstore.ErrCorrupt):
		return status.Error(codes.DataLoss, err.Error())
	case errors.Is(err, walstore.ErrNotHeld):
		return status.Error(codes.OutOfRange, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

type wrapped struct {
	sentinel error
	msg      string
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.sentinel }

func fromErr(err error) error {
	st, ok := status.FromError(err)
	if !ok || err == nil {
		return err
	}
	var s error
	switch st.Code() {
	case codes.Aborted:
		s = election.ErrStaleTerm
	case codes.FailedPrecondition:
		s = election.ErrNotVoted
	case codes.DataLoss:
		s = walstore.ErrCorrupt
	case codes.OutOfRange:
		s = walstore.ErrNotHeld
	case codes.Canceled:
		s = context.Canceled
	case codes.DeadlineExceeded:
		s = context.DeadlineExceeded
	default:
		return err
	}
	return &wrapped{sentinel: s, msg: st.Message()}
}

func historyToPB(h election.History) []*pb.TermStart {
	out := make([]*pb.TermStart, len(h))
	for i, e := range h {
		out[i] = &pb.TermStart{Term: e.Term, StartLsn: uint64(e.Start)}
	}
	return out
}

func historyFromPB(h []*pb.TermStart) election.History {
	out := make(election.History, len(h))
	for i, e := range h {
		out[i] = election.TermStart{Term: e.GetTerm(), Start: pg.LSN(e.GetStartLsn())}
	}
	return out
}

func (s *service) Status(ctx context.Context, _ *pb.StatusRequest) (*pb.StatusResponse, error) {
	st := s.b.Status()
	return &pb.StatusResponse{Id: st.ID, Term: st.Term, ComputeId: st.ComputeID, Accepted: st.Accepted,
		History: historyToPB(st.History), StartLsn: uint64(st.StartLSN), FlushLsn: uint64(st.FlushLSN),
		CommitLsn: uint64(st.CommitLSN), ArchivedLsn: uint64(st.ArchivedLSN), SystemId: st.SystemID,
		Timeline: uint32(st.Timeline), SegmentSize: st.SegmentSize, Consumers: consumersToPB(st.Consumers),
		ArchiveFailingSinceMs: st.Archive.SinceMillis(), ArchiveFailures: uint32(st.Archive.Failures), ArchiveError: st.Archive.Err}, nil
}

func consumersToPB(m map[string]Feedback) []*pb.ConsumerProgress {
	out := make([]*pb.ConsumerProgress, 0, len(m))
	for id, fb := range m {
		out = append(out, &pb.ConsumerProgress{ConsumerId: id, ReceivedLsn: uint64(fb.Received),
			DurableLsn: uint64(fb.Durable), UploadedLsn: uint64(fb.Uploaded)})
	}
	return out
}

func consumersFromPB(cs []*pb.ConsumerProgress) map[string]Feedback {
	if len(cs) == 0 {
		return nil
	}
	m := make(map[string]Feedback, len(cs))
	for _, c := range cs {
		m[c.GetConsumerId()] = Feedback{Received: pg.LSN(c.GetReceivedLsn()), Durable: pg.LSN(c.GetDurableLsn()), Uploaded: pg.LSN(c.GetUploadedLsn())}
	}
	return m
}

func (s *service) Vote(ctx context.Context, r *pb.VoteRequest) (*pb.VoteResponse, error) {
	v, err := s.b.Vote(ctx, election.VoteRequest{Term: r.GetTerm(), ComputeID: r.GetComputeId()})
	if err != nil {
		return nil, toErr(err)
	}
	return &pb.VoteResponse{Granted: v.Granted, Term: v.Term, History: historyToPB(v.History), FlushLsn: uint64(v.Flush)}, nil
}

func (s *service) Accept(ctx context.Context, r *pb.AcceptRequest) (*pb.AcceptResponse, error) {
	req := election.AcceptRequest{Term: r.GetTerm(), ComputeID: r.GetComputeId(), Start: pg.LSN(r.GetStartLsn()),
		Donor: r.GetDonor(), DonorHistory: historyFromPB(r.GetDonorHistory())}
	flush, err := s.b.Accept(ctx, req, r.GetPostgres())
	if err != nil {
		return nil, toErr(err)
	}
	return &pb.AcceptResponse{Term: r.GetTerm(), FlushLsn: uint64(flush)}, nil
}

func (s *service) StreamWAL(stream pb.Safekeeper_StreamWALServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	ctx := stream.Context()
	consumer := first.GetConsumerId()
	feedback := func(r *pb.StreamWALRequest) {
		if consumer != "" && (r.GetReceivedLsn() != 0 || r.GetDurableLsn() != 0 || r.GetUploadedLsn() != 0) {
			s.b.Feedback(consumer, Feedback{Received: pg.LSN(r.GetReceivedLsn()), Durable: pg.LSN(r.GetDurableLsn()), Uploaded: pg.LSN(r.GetUploadedLsn())})
		}
	}
	feedback(first)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			feedback(r)
		}
	}()
	st := s.b.Store()
	pos, stop := pg.LSN(first.GetStartLsn()), pg.LSN(first.GetStopLsn())
	bound := first.GetBound()
	arch := archiveReader{b: s.b}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		flushCh, commitCh := st.FlushNotify(), (<-chan struct{})(nil)
		limit := st.FlushLSN()
		if bound == pb.Bound_BOUND_COMMIT {
			commitCh = s.b.CommitNotify()
			limit = min(limit, s.b.CommitLSN())
		}
		if stop > 0 {
			limit = min(limit, stop)
		}
		if pos < limit {
			data, err := st.Read(pos, int(min(limit-pos, MaxChunk)))
			if errors.Is(err, walstore.ErrNotHeld) && pos < st.StartLSN() {
				data, err = arch.read(ctx, pos, limit)
			}
			if err != nil {
				return toErr(err)
			}
			if err := stream.Send(&pb.WALChunk{StartLsn: uint64(pos), Data: data, CommitLsn: uint64(s.b.CommitLSN()), FlushLsn: uint64(st.FlushLSN())}); err != nil {
				return err
			}
			s.b.Sent(len(data))
			pos += pg.LSN(len(data))
			continue
		}
		if stop > 0 && pos >= stop {
			return nil
		}
		select {
		case <-ctx.Done():
			return toErr(ctx.Err())
		case <-flushCh:
		case <-commitCh:
		case <-tick.C:
		}
	}
}

// archiveReader serves one stream's WAL from below the store's start LSN,
// a segment at a time.
type archiveReader struct {
	b     Backend
	start pg.LSN // first LSN of seg
	seg   []byte
}

// read returns WAL from pos, at most MaxChunk bytes and never past limit
// nor the end of pos's segment.
func (a *archiveReader) read(ctx context.Context, pos, limit pg.LSN) ([]byte, error) {
	if pos < a.start || pos >= a.start+pg.LSN(len(a.seg)) {
		ar, ok := a.b.(Archive)
		if !ok {
			return nil, fmt.Errorf("%w: %s was removed and there is no archive to read it from", walstore.ErrNotHeld, pos)
		}
		start, seg, err := ar.ArchivedSegment(ctx, pos)
		if err != nil {
			return nil, err
		}
		a.start, a.seg = start, seg
	}
	end := min(limit, a.start+pg.LSN(len(a.seg)), pos+MaxChunk)
	return a.seg[pos-a.start : end-a.start], nil // Send copies it
}
