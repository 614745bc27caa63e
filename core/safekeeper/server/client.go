package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stratadb/strata/core/safekeeper/election"
	pb "github.com/stratadb/strata/core/safekeeper/safekeeperpb"
	"github.com/stratadb/strata/internal/rawio"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/pg"
)

// Client talks to one safekeeper. It is safe for concurrent use.
type Client struct {
	Addr string
	conn *grpc.ClientConn
	c    pb.SafekeeperClient
}

// Dial returns a client of the safekeeper at addr (plaintext gRPC; the
// connection is made lazily).
func Dial(addr string) (*Client, error) { return dial(addr) }

// DialRaw is Dial with raw socket reads and writes (internal/rawio): a
// safekeeper's calls to its peers, which would otherwise wake the Go
// runtime's monitor thread at every poll of their flush LSNs.
func DialRaw(addr string) (*Client, error) {
	return dial(addr, grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return rawio.WrapConn(c), nil
	}))
}

func dial(addr string, opts ...grpc.DialOption) (*Client, error) {
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxChunk + (1 << 20))),
		grpc.WithInitialWindowSize(4 << 20), grpc.WithInitialConnWindowSize(8 << 20)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("server: dial %s: %w", addr, err)
	}
	return &Client{Addr: addr, conn: conn, c: pb.NewSafekeeperClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Status returns the safekeeper's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	r, err := c.c.Status(ctx, &pb.StatusRequest{})
	if err != nil {
		return Status{}, fromErr(err)
	}
	st := Status{ID: r.GetId(), Term: r.GetTerm(), ComputeID: r.GetComputeId(), Accepted: r.GetAccepted(),
		History: historyFromPB(r.GetHistory()), StartLSN: pg.LSN(r.GetStartLsn()), FlushLSN: pg.LSN(r.GetFlushLsn()),
		CommitLSN: pg.LSN(r.GetCommitLsn()), ArchivedLSN: pg.LSN(r.GetArchivedLsn()), SystemID: r.GetSystemId(),
		Timeline: pg.PGTimeline(r.GetTimeline()), SegmentSize: r.GetSegmentSize(), Consumers: consumersFromPB(r.GetConsumers())}
	st.Archive = trouble.FromWire(r.GetArchiveFailingSinceMs(), r.GetArchiveFailures(), r.GetArchiveError())
	return st, nil
}

// Vote asks for the safekeeper's vote.
func (c *Client) Vote(ctx context.Context, req election.VoteRequest) (election.VoteResponse, error) {
	r, err := c.c.Vote(ctx, &pb.VoteRequest{Term: req.Term, ComputeId: req.ComputeID})
	if err != nil {
		return election.VoteResponse{}, fromErr(err)
	}
	return election.VoteResponse{Granted: r.GetGranted(), Term: r.GetTerm(), History: historyFromPB(r.GetHistory()), Flush: pg.LSN(r.GetFlushLsn())}, nil
}

// Accept sends the elected proposer's message; postgres is host:port of the
// new compute ("" keeps the safekeeper's configured one).
func (c *Client) Accept(ctx context.Context, req election.AcceptRequest, postgres string) (pg.LSN, error) {
	r, err := c.c.Accept(ctx, &pb.AcceptRequest{Term: req.Term, ComputeId: req.ComputeID, StartLsn: uint64(req.Start),
		Donor: req.Donor, DonorHistory: historyToPB(req.DonorHistory), Postgres: postgres})
	if err != nil {
		return 0, fromErr(err)
	}
	return pg.LSN(r.GetFlushLsn()), nil
}

// ReadWAL calls fn with consecutive chunks of WAL from `from` up to `to`
// (to == 0: follow new WAL until ctx ends), bounded by bound. fn must not
// keep data after it returns.
func (c *Client) ReadWAL(ctx context.Context, from, to pg.LSN, bound Bound, fn func(lsn pg.LSN, data []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := c.c.StreamWAL(ctx)
	if err != nil {
		return fromErr(err)
	}
	b := pb.Bound_BOUND_COMMIT
	if bound == BoundFlush {
		b = pb.Bound_BOUND_FLUSH
	}
	if err := s.Send(&pb.StreamWALRequest{StartLsn: uint64(from), StopLsn: uint64(to), Bound: b}); err != nil {
		return fromErr(err)
	}
	pos := from
	for to == 0 || pos < to {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			if to != 0 && pos < to {
				return fmt.Errorf("server: stream from %s ended at %s, before %s", c.Addr, pos, to)
			}
			return nil
		}
		if err != nil {
			return fromErr(err)
		}
		if pg.LSN(m.GetStartLsn()) != pos {
			return fmt.Errorf("server: stream from %s jumped to %s, expected %s", c.Addr, pg.LSN(m.GetStartLsn()), pos)
		}
		if err := fn(pos, m.GetData()); err != nil {
			return err
		}
		pos += pg.LSN(len(m.GetData()))
	}
	return nil
}

// Consumer is an open WAL stream with feedback, for the pageserver.
type Consumer struct {
	s      pb.Safekeeper_StreamWALClient
	cancel context.CancelFunc
}

// Chunk is a piece of WAL with the safekeeper's positions at send time.
type Chunk struct {
	Start     pg.LSN
	Data      []byte
	CommitLSN pg.LSN
	FlushLSN  pg.LSN
}

// Consume opens a stream of committed WAL from `from` for consumer id.
func (c *Client) Consume(ctx context.Context, id string, from pg.LSN) (*Consumer, error) {
	ctx, cancel := context.WithCancel(ctx)
	s, err := c.c.StreamWAL(ctx)
	if err != nil {
		cancel()
		return nil, fromErr(err)
	}
	if err := s.Send(&pb.StreamWALRequest{StartLsn: uint64(from), ConsumerId: id, Bound: pb.Bound_BOUND_COMMIT}); err != nil {
		cancel()
		return nil, fromErr(err)
	}
	return &Consumer{s: s, cancel: cancel}, nil
}

// Recv returns the next chunk.
func (c *Consumer) Recv() (Chunk, error) {
	m, err := c.s.Recv()
	if err != nil {
		return Chunk{}, fromErr(err)
	}
	return Chunk{Start: pg.LSN(m.GetStartLsn()), Data: m.GetData(), CommitLSN: pg.LSN(m.GetCommitLsn()), FlushLSN: pg.LSN(m.GetFlushLsn())}, nil
}

// Feedback reports the consumer's progress; the safekeeper removes local WAL
// only below what is both archived and durable at the consumer.
func (c *Consumer) Feedback(fb Feedback) error {
	return fromErr(c.s.Send(&pb.StreamWALRequest{ReceivedLsn: uint64(fb.Received), DurableLsn: uint64(fb.Durable), UploadedLsn: uint64(fb.Uploaded)}))
}

// Close ends the stream.
func (c *Consumer) Close() { c.cancel() }
