// Package client is the Go client of the pageserver's gRPC API, for the
// compute agent and the CLI. It speaks Go types (pg.PageKey, pg.LSN) and
// returns the timeline package's sentinel errors (timeline.ErrNotFound,
// timeline.ErrWaitLSNTimeout, timeline.ErrBelowGCCutoff) so callers test
// with errors.Is.
//
// GetPages multiplexes batches from many goroutines over one bidirectional
// stream; a broken stream fails the batches in flight and is reopened on
// the next call.
//
// # Terms and incarnations (the compute's contract)
//
// Writes (PutPages, SetRelSize, DropRel, WriteFile, TruncateFile,
// UnlinkFile) carry the client's term (SetTerm; BeginTerm sets it too).
// A compute that won the safekeeper election for term T with durable end E
// calls BeginTerm(T, E) once, before its first write: the pageserver drops
// every pending version above E (a dead compute's writes) and from then on
// refuses writes of lower terms with pageserver.ErrStaleTerm. Term 0 means
// unfenced (tests, tools).
//
// Every write answer (the *Ack methods) and GetDurable carry an Ack: the
// timeline's durable LSN and the pageserver's incarnation, a random number
// drawn when the pageserver process started. Versions above the durable
// LSN (pending: their W is above the safekeepers' commit LSN) live only in
// the pageserver's memory, so the compute must:
//
//  1. note, for each write it has not yet seen durable, the incarnation of
//     the Ack that accepted it;
//  2. treat a write as durable only when an Ack of that same incarnation
//     has Durable >= its W;
//  3. when an Ack (or GetDurable) shows another incarnation while it still
//     holds such writes, consider them lost: re-send them (it still has the
//     bytes) before it declares them durable, or fail the fsync that waits
//     for them (EIO), never report success;
//  4. not use a page or file read (GetPageAck, GetFileAck) answered by
//     another incarnation while it holds such writes: the answer may be
//     an older version of a page whose newer version was lost.
//
// The plain methods (PutPages returning the durable LSN, SetRelSize, ...)
// are the same calls without the incarnation; Incarnation returns the one
// of the newest answer seen, which is not enough for rule 3 under
// concurrency.
package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/pageserver"
	pb "github.com/stratadb/strata/core/pageserver/pageserverpb"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/pg"
)

// ErrClosed: the client was closed.
var ErrClosed = errors.New("client: closed")

// LatestLSN asks for the newest version.
const LatestLSN = timeline.LatestLSN

// Client talks to one pageserver. Safe for concurrent use.
type Client struct {
	conn *grpc.ClientConn
	rpc  pb.PageServiceClient

	mu      sync.Mutex
	stream  pb.PageService_GetPagesClient
	cancel  context.CancelFunc
	nextID  uint64
	waiting map[uint64]chan result
	closed  bool

	term        atomic.Uint64
	incarnation atomic.Uint64
}

// Ack is the answer of a write and of GetDurable.
type Ack struct {
	// Durable is the timeline's durable LSN: every version at or below it
	// that this incarnation accepted survives a pageserver restart.
	Durable pg.LSN
	// Incarnation identifies the pageserver process (random, non-zero).
	Incarnation uint64
}

func (c *Client) ack(r *pb.PutPagesResponse) Ack {
	c.saw(r.Incarnation)
	return Ack{Durable: pg.LSN(r.DurableLsn), Incarnation: r.Incarnation}
}

// saw records the incarnation of an answer (0: the answer names none).
func (c *Client) saw(inc uint64) {
	if inc != 0 {
		c.incarnation.Store(inc)
	}
}

// SetTerm sets the term every later write carries (0: unfenced).
func (c *Client) SetTerm(term uint64) { c.term.Store(term) }

// Term returns the term writes carry.
func (c *Client) Term() uint64 { return c.term.Load() }

// Incarnation returns the pageserver incarnation of the newest answer seen
// (0: none yet).
func (c *Client) Incarnation() uint64 { return c.incarnation.Load() }

type result struct {
	resp *pb.GetPageBatchResponse
	err  error
}

// Dial connects to addr (host:port, plaintext: loopback or a private network).
func Dial(addr string, opts ...grpc.DialOption) (*Client, error) {
	opts = append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256 << 20)),
	}, opts...)
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, rpc: pb.NewPageServiceClient(conn), waiting: map[uint64]chan result{}}, nil
}

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	if c.cancel != nil {
		c.cancel()
	}
	c.mu.Unlock()
	return c.conn.Close()
}

// fromStatus maps gRPC status codes back to sentinel errors.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.NotFound:
		if containsTimeline(st.Message()) {
			return wrapMessage(pageserver.ErrNoTimeline, st.Message())
		}
		return wrapMessage(timeline.ErrNotFound, st.Message())
	case codes.DeadlineExceeded:
		return wrapMessage(timeline.ErrWaitLSNTimeout, st.Message())
	case codes.OutOfRange:
		return wrapMessage(timeline.ErrBelowGCCutoff, st.Message())
	case codes.AlreadyExists:
		return wrapMessage(pageserver.ErrTimelineExists, st.Message())
	case codes.FailedPrecondition:
		return wrapMessage(pageserver.ErrStaleTerm, st.Message())
	}
	return err
}

// wrapMessage wraps sentinel around the server's message, which usually
// begins with the sentinel's own text (the server wrapped it too): that
// is not said twice.
func wrapMessage(sentinel error, msg string) error {
	if m, ok := strings.CutPrefix(msg, sentinel.Error()+": "); ok {
		msg = m
	}
	return fmt.Errorf("%w: %s", sentinel, msg)
}

func containsTimeline(msg string) bool {
	const p = "pageserver: no such timeline"
	return len(msg) >= len(p) && msg[:len(p)] == p
}

func fromCode(c pb.Code, msg string) error {
	switch c {
	case pb.Code_OK:
		return nil
	case pb.Code_NOT_FOUND:
		return fmt.Errorf("%w: %s", timeline.ErrNotFound, msg)
	case pb.Code_WAIT_TIMEOUT:
		return fmt.Errorf("%w: %s", timeline.ErrWaitLSNTimeout, msg)
	case pb.Code_BELOW_GC_CUTOFF:
		return fmt.Errorf("%w: %s", timeline.ErrBelowGCCutoff, msg)
	}
	return fmt.Errorf("client: %s", msg)
}

func rt(r pg.RelTag) *pb.RelTag {
	return &pb.RelTag{Spc: r.Spc, Db: r.DB, Rel: r.Rel, Fork: uint32(r.Fork)}
}

// PageRequest asks for one page.
type PageRequest struct {
	Page             pg.PageKey
	RequestLSN       pg.LSN // LatestLSN for a primary
	NotModifiedSince pg.LSN
}

// PageResult is one page of a GetPages answer: Data, or Err.
type PageResult struct {
	Data []byte
	Err  error
	// Incarnation of the pageserver that answered (0: one that does not
	// say), the same for every result of a batch.
	Incarnation uint64
}

// streamLocked returns the shared stream, opening it if needed.
func (c *Client) streamLocked() (pb.PageService_GetPagesClient, error) {
	if c.closed {
		return nil, ErrClosed
	}
	if c.stream != nil {
		return c.stream, nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.rpc.GetPages(ctx)
	if err != nil {
		cancel()
		return nil, fromStatus(err)
	}
	c.stream, c.cancel = s, cancel
	go c.receive(s)
	return s, nil
}

func (c *Client) receive(s pb.PageService_GetPagesClient) {
	for {
		resp, err := s.Recv()
		c.mu.Lock()
		if err != nil {
			if c.stream == s {
				c.stream = nil
				c.cancel()
			}
			for id, ch := range c.waiting {
				ch <- result{err: fmt.Errorf("client: GetPages stream: %w", fromStatus(err))}
				delete(c.waiting, id)
			}
			c.mu.Unlock()
			return
		}
		ch, ok := c.waiting[resp.Id]
		delete(c.waiting, resp.Id)
		c.mu.Unlock()
		if ok {
			ch <- result{resp: resp}
		}
	}
}

// GetPages reads a batch of pages of one timeline. The returned slice has
// one result per request, in order; err is set only when the whole batch
// failed (connection, unknown timeline).
func (c *Client) GetPages(ctx context.Context, tl pg.TimelineID, reqs []PageRequest) ([]PageResult, error) {
	b := &pb.GetPageBatch{Timeline: tl[:], Pages: make([]*pb.GetPageRequest, len(reqs))}
	for i, r := range reqs {
		b.Pages[i] = &pb.GetPageRequest{Rel: rt(r.Page.Tag()), Block: r.Page.Block, RequestLsn: uint64(r.RequestLSN), NotModifiedSince: uint64(r.NotModifiedSince)}
	}
	ch := make(chan result, 1)
	c.mu.Lock()
	s, err := c.streamLocked()
	if err != nil {
		c.mu.Unlock()
		return nil, err
	}
	c.nextID++
	b.Id = c.nextID
	c.waiting[b.Id] = ch
	err = s.Send(b)
	if err != nil {
		delete(c.waiting, b.Id)
	}
	c.mu.Unlock()
	if err != nil {
		if err == io.EOF {
			err = errors.New("client: GetPages stream closed")
		}
		return nil, err
	}
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.waiting, b.Id)
		c.mu.Unlock()
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, r.err
	}
	if len(r.resp.Results) != len(reqs) {
		return nil, fmt.Errorf("client: %d results for %d pages", len(r.resp.Results), len(reqs))
	}
	out := make([]PageResult, len(reqs))
	for i, pr := range r.resp.Results {
		out[i] = PageResult{Data: pr.Page, Err: fromCode(pr.Code, pr.Error), Incarnation: r.resp.Incarnation}
		if pr.Code == pb.Code_ERROR && containsTimeline(pr.Error) {
			return nil, fmt.Errorf("%w: %s", pageserver.ErrNoTimeline, pr.Error)
		}
	}
	c.saw(r.resp.Incarnation)
	return out, nil
}

// GetPage reads one page.
func (c *Client) GetPage(ctx context.Context, tl pg.TimelineID, r PageRequest) ([]byte, error) {
	data, _, err := c.GetPageAck(ctx, tl, r)
	return data, err
}

// GetPageAck is GetPage with the answering incarnation (rule 4; the Ack's
// Durable is not set).
func (c *Client) GetPageAck(ctx context.Context, tl pg.TimelineID, r PageRequest) ([]byte, Ack, error) {
	res, err := c.GetPages(ctx, tl, []PageRequest{r})
	if err != nil {
		return nil, Ack{}, err
	}
	return res[0].Data, Ack{Incarnation: res[0].Incarnation}, res[0].Err
}

// PageWrite is a page image written at the compute's WAL position W.
type PageWrite = timeline.PageWrite

// PutPages sends page writes (writeback mode). It returns the timeline's
// durable LSN: writes at or below it survive a pageserver restart.
func (c *Client) PutPages(ctx context.Context, tl pg.TimelineID, ws []PageWrite) (pg.LSN, error) {
	a, err := c.PutPagesAck(ctx, tl, ws)
	return a.Durable, err
}

// SizeWrite is a relation fork's size written at W with PutPagesAck.
type SizeWrite = timeline.SizeWrite

// PutPagesAck is PutPages with the incarnation (see the package doc), and
// with fork sizes stored in the same write after the pages (a fork
// created since the last send, a size restated above its pages): one round
// trip for all of them.
func (c *Client) PutPagesAck(ctx context.Context, tl pg.TimelineID, ws []PageWrite, sizes ...SizeWrite) (Ack, error) {
	req := &pb.PutPagesRequest{Timeline: tl[:], Pages: make([]*pb.PageWrite, len(ws)), Term: c.Term()}
	for i, w := range ws {
		req.Pages[i] = &pb.PageWrite{Rel: rt(w.Page.Tag()), Block: w.Page.Block, W: uint64(w.W), Page: w.Data}
	}
	for _, s := range sizes {
		req.Sizes = append(req.Sizes, &pb.RelSizeWrite{Rel: rt(s.Rel), Nblocks: s.Nblocks, W: uint64(s.W), Drop: s.Drop})
	}
	resp, err := c.rpc.PutPages(ctx, req)
	if err != nil {
		return Ack{}, fromStatus(err)
	}
	return c.ack(resp), nil
}

// GetDurable returns the timeline's durable LSN and the incarnation.
func (c *Client) GetDurable(ctx context.Context, tl pg.TimelineID) (Ack, error) {
	resp, err := c.rpc.GetDurable(ctx, &pb.GetDurableRequest{Timeline: tl[:]})
	if err != nil {
		return Ack{}, fromStatus(err)
	}
	return c.ack(resp), nil
}

// BeginTerm starts term (won in the safekeeper election with durable end
// e) on the timeline: the pageserver drops pending versions above e and
// refuses writes of lower terms from then on. It also makes term the
// client's write term. It returns the number of dropped versions and the
// Ack after the drop.
func (c *Client) BeginTerm(ctx context.Context, tl pg.TimelineID, term uint64, e pg.LSN) (int, Ack, error) {
	resp, err := c.rpc.BeginTerm(ctx, &pb.BeginTermRequest{Timeline: tl[:], Term: term, DurableEnd: uint64(e)})
	if err != nil {
		return 0, Ack{}, fromStatus(err)
	}
	c.SetTerm(term)
	return int(resp.Dropped), c.ack(&pb.PutPagesResponse{DurableLsn: resp.DurableLsn, Incarnation: resp.Incarnation}), nil
}

// RelSize is a relation fork's size and existence.
type RelSize struct {
	Exists  bool
	Nblocks uint32
}

// Nblocks returns the sizes of relation forks at lsn.
func (c *Client) Nblocks(ctx context.Context, tl pg.TimelineID, rels []pg.RelTag, lsn, notModifiedSince pg.LSN) ([]RelSize, error) {
	req := &pb.NblocksRequest{Timeline: tl[:], RequestLsn: uint64(lsn), NotModifiedSince: uint64(notModifiedSince)}
	for _, r := range rels {
		req.Rels = append(req.Rels, rt(r))
	}
	resp, err := c.rpc.Nblocks(ctx, req)
	if err != nil {
		return nil, fromStatus(err)
	}
	if len(resp.Exists) != len(rels) || len(resp.Nblocks) != len(rels) {
		return nil, errors.New("client: short Nblocks answer")
	}
	out := make([]RelSize, len(rels))
	for i := range rels {
		out[i] = RelSize{Exists: resp.Exists[i], Nblocks: resp.Nblocks[i]}
	}
	return out, nil
}

// Exists reports whether a relation fork exists at lsn.
func (c *Client) Exists(ctx context.Context, tl pg.TimelineID, rel pg.RelTag, lsn pg.LSN) (bool, error) {
	r, err := c.Nblocks(ctx, tl, []pg.RelTag{rel}, lsn, 0)
	if err != nil {
		return false, err
	}
	return r[0].Exists, nil
}

// DBSize returns the size of a database's relations in bytes.
func (c *Client) DBSize(ctx context.Context, tl pg.TimelineID, spc, db uint32, lsn pg.LSN) (int64, error) {
	resp, err := c.rpc.DbSize(ctx, &pb.DbSizeRequest{Timeline: tl[:], Spc: spc, Db: db, RequestLsn: uint64(lsn)})
	if err != nil {
		return 0, fromStatus(err)
	}
	return resp.Bytes, nil
}

// SetRelSize creates, truncates or extends a relation fork at W.
func (c *Client) SetRelSize(ctx context.Context, tl pg.TimelineID, rel pg.RelTag, n uint32, w pg.LSN) error {
	_, err := c.SetRelSizeAck(ctx, tl, rel, n, w)
	return err
}

// SetRelSizeAck is SetRelSize with the Ack.
func (c *Client) SetRelSizeAck(ctx context.Context, tl pg.TimelineID, rel pg.RelTag, n uint32, w pg.LSN) (Ack, error) {
	return c.relOp(ctx, &pb.RelOpRequest{Timeline: tl[:], Op: pb.RelOpRequest_SET_SIZE, Rel: rt(rel), Nblocks: n, W: uint64(w)})
}

// DropRel drops a relation fork at W.
func (c *Client) DropRel(ctx context.Context, tl pg.TimelineID, rel pg.RelTag, w pg.LSN) error {
	_, err := c.DropRelAck(ctx, tl, rel, w)
	return err
}

// DropRelAck is DropRel with the Ack.
func (c *Client) DropRelAck(ctx context.Context, tl pg.TimelineID, rel pg.RelTag, w pg.LSN) (Ack, error) {
	return c.relOp(ctx, &pb.RelOpRequest{Timeline: tl[:], Op: pb.RelOpRequest_DROP, Rel: rt(rel), W: uint64(w)})
}

func (c *Client) relOp(ctx context.Context, r *pb.RelOpRequest) (Ack, error) {
	r.Term = c.Term()
	resp, err := c.rpc.RelOp(ctx, r)
	if err != nil {
		return Ack{}, fromStatus(err)
	}
	return c.ack(resp), nil
}

func (c *Client) fileOp(ctx context.Context, r *pb.FileOpRequest) (Ack, error) {
	r.Term = c.Term()
	resp, err := c.rpc.FileOp(ctx, r)
	if err != nil {
		return Ack{}, fromStatus(err)
	}
	return c.ack(resp), nil
}

// GetFile returns a non-relation file's content at lsn.
func (c *Client) GetFile(ctx context.Context, tl pg.TimelineID, path string, lsn pg.LSN) ([]byte, error) {
	data, _, err := c.GetFileAck(ctx, tl, path, lsn)
	return data, err
}

// GetFileAck is GetFile with the answering incarnation (rule 4; the Ack's
// Durable is not set).
func (c *Client) GetFileAck(ctx context.Context, tl pg.TimelineID, path string, lsn pg.LSN) ([]byte, Ack, error) {
	resp, err := c.rpc.GetFile(ctx, &pb.GetFileRequest{Timeline: tl[:], Path: path, RequestLsn: uint64(lsn)})
	if err != nil {
		return nil, Ack{}, fromStatus(err)
	}
	c.saw(resp.Incarnation)
	return resp.Data, Ack{Incarnation: resp.Incarnation}, nil
}

// WriteFile writes data at off into a non-relation file at W.
func (c *Client) WriteFile(ctx context.Context, tl pg.TimelineID, path string, off int64, data []byte, w pg.LSN) error {
	_, err := c.WriteFileAck(ctx, tl, path, off, data, w)
	return err
}

// WriteFileAck is WriteFile with the Ack.
func (c *Client) WriteFileAck(ctx context.Context, tl pg.TimelineID, path string, off int64, data []byte, w pg.LSN) (Ack, error) {
	return c.fileOp(ctx, &pb.FileOpRequest{Timeline: tl[:], Op: pb.FileOpRequest_WRITE, Path: path, Offset: off, Data: data, W: uint64(w)})
}

// TruncateFile sets a non-relation file's size at W.
func (c *Client) TruncateFile(ctx context.Context, tl pg.TimelineID, path string, size int64, w pg.LSN) error {
	_, err := c.TruncateFileAck(ctx, tl, path, size, w)
	return err
}

// TruncateFileAck is TruncateFile with the Ack.
func (c *Client) TruncateFileAck(ctx context.Context, tl pg.TimelineID, path string, size int64, w pg.LSN) (Ack, error) {
	return c.fileOp(ctx, &pb.FileOpRequest{Timeline: tl[:], Op: pb.FileOpRequest_TRUNCATE, Path: path, Size: size, W: uint64(w)})
}

// ReplaceFileAck makes data the whole content of a non-relation file at W
// (created if needed), in one step, and returns the Ack.
func (c *Client) ReplaceFileAck(ctx context.Context, tl pg.TimelineID, path string, data []byte, w pg.LSN) (Ack, error) {
	return c.fileOp(ctx, &pb.FileOpRequest{Timeline: tl[:], Op: pb.FileOpRequest_REPLACE, Path: path, Data: data, W: uint64(w)})
}

// UnlinkFile removes a non-relation file at W.
func (c *Client) UnlinkFile(ctx context.Context, tl pg.TimelineID, path string, w pg.LSN) error {
	_, err := c.UnlinkFileAck(ctx, tl, path, w)
	return err
}

// UnlinkFileAck is UnlinkFile with the Ack.
func (c *Client) UnlinkFileAck(ctx context.Context, tl pg.TimelineID, path string, w pg.LSN) (Ack, error) {
	return c.fileOp(ctx, &pb.FileOpRequest{Timeline: tl[:], Op: pb.FileOpRequest_UNLINK, Path: path, W: uint64(w)})
}

// FileInfo names a non-relation file.
type FileInfo = timeline.FileInfo

// ListFiles returns the non-relation files and the relation forks at lsn.
func (c *Client) ListFiles(ctx context.Context, tl pg.TimelineID, lsn pg.LSN) ([]FileInfo, []pg.RelTag, error) {
	resp, err := c.rpc.ListFiles(ctx, &pb.ListFilesRequest{Timeline: tl[:], RequestLsn: uint64(lsn)})
	if err != nil {
		return nil, nil, fromStatus(err)
	}
	var fs []FileInfo
	for _, f := range resp.Files {
		fs = append(fs, FileInfo{Path: f.Path, Size: f.Size})
	}
	var rels []pg.RelTag
	for _, r := range resp.Rels {
		rels = append(rels, pg.RelTag{Spc: r.Spc, DB: r.Db, Rel: r.Rel, Fork: pg.ForkNumber(r.Fork)})
	}
	return fs, rels, nil
}

// Basebackup writes a tar of the data directory at lsn to w.
func (c *Client) Basebackup(ctx context.Context, tl pg.TimelineID, lsn pg.LSN, w io.Writer) error {
	s, err := c.rpc.Basebackup(ctx, &pb.BasebackupRequest{Timeline: tl[:], Lsn: uint64(lsn)})
	if err != nil {
		return fromStatus(err)
	}
	for {
		ch, err := s.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fromStatus(err)
		}
		if _, err := w.Write(ch.Data); err != nil {
			return err
		}
	}
}

// TimelineInfo describes a timeline.
type TimelineInfo struct {
	ID          pg.TimelineID
	Ancestor    pg.TimelineID // zero for a root
	AncestorLSN pg.LSN
	LSNs        timeline.LSNs
	Layers      int
	// Incarnation of the answering pageserver; Term: the timeline's
	// compute term (0: never set).
	Incarnation uint64
	Term        uint64
	// Upload: the current run of failed uploads to the object store
	// (zero: the last upload succeeded).
	Upload trouble.Run
}

func fromInfo(i *pb.TimelineInfo) TimelineInfo {
	var t TimelineInfo
	copy(t.ID[:], i.Timeline)
	copy(t.Ancestor[:], i.Ancestor)
	t.AncestorLSN = pg.LSN(i.AncestorLsn)
	t.LSNs = timeline.LSNs{LastRecord: pg.LSN(i.LastRecordLsn), Commit: pg.LSN(i.CommitLsn), Durable: pg.LSN(i.DurableLsn),
		RemoteConsistent: pg.LSN(i.RemoteConsistentLsn), GCCutoff: pg.LSN(i.GcCutoff), Lease: pg.LSN(i.Lease), Pending: int(i.Pending)}
	t.Layers = int(i.Layers)
	t.Incarnation, t.Term = i.Incarnation, i.Term
	t.Upload = trouble.FromWire(i.UploadFailingSinceMs, i.UploadFailures, i.UploadError)
	return t
}

// CreateTimeline creates an empty root timeline.
func (c *Client) CreateTimeline(ctx context.Context, id pg.TimelineID) (TimelineInfo, error) {
	r, err := c.rpc.CreateTimeline(ctx, &pb.TimelineRequest{Timeline: id[:]})
	if err != nil {
		return TimelineInfo{}, fromStatus(err)
	}
	return fromInfo(r), nil
}

// Branch creates id as a branch of parent at LSN at (0: the parent's last record).
func (c *Client) Branch(ctx context.Context, parent, id pg.TimelineID, at pg.LSN) (TimelineInfo, error) {
	r, err := c.rpc.CreateTimeline(ctx, &pb.TimelineRequest{Timeline: id[:], Ancestor: parent[:], AncestorLsn: uint64(at)})
	if err != nil {
		return TimelineInfo{}, fromStatus(err)
	}
	return fromInfo(r), nil
}

// ListTimelines lists the pageserver's timelines.
func (c *Client) ListTimelines(ctx context.Context) ([]TimelineInfo, error) {
	r, err := c.rpc.ListTimelines(ctx, &pb.ListTimelinesRequest{})
	if err != nil {
		return nil, fromStatus(err)
	}
	var out []TimelineInfo
	for _, i := range r.Timelines {
		out = append(out, fromInfo(i))
	}
	return out, nil
}

// AdvanceCommitLSN raises a timeline's commit LSN (writeback gate).
func (c *Client) AdvanceCommitLSN(ctx context.Context, id pg.TimelineID, lsn pg.LSN) error {
	_, err := c.rpc.AdvanceCommitLSN(ctx, &pb.AdvanceCommitLSNRequest{Timeline: id[:], CommitLsn: uint64(lsn)})
	return fromStatus(err)
}

// LeaseLSN keeps the history that reads at lsn on timeline id need for
// ttl (at most timeline.MaxLeaseTTL): the pageserver's GC does not pass
// lsn meanwhile. holder names the lease (one per reader: only its holder
// renews or ends it). It returns when the lease ends; renew it before
// then. ttl 0 ends the lease. An lsn below the GC cutoff fails with
// timeline.ErrBelowGCCutoff.
func (c *Client) LeaseLSN(ctx context.Context, id pg.TimelineID, lsn pg.LSN, holder string, ttl time.Duration) (time.Time, error) {
	r, err := c.rpc.LeaseLSN(ctx, &pb.LeaseLSNRequest{Timeline: id[:], Lsn: uint64(lsn), Holder: holder, TtlMs: uint32(ttl.Milliseconds())})
	if err != nil {
		return time.Time{}, fromStatus(err)
	}
	if r.ExpiresUnixMs == 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(r.ExpiresUnixMs), nil
}

// ImportTarget returns timeline tl as the target of
// pageserver.ImportDataDir: writes go over gRPC with the client's term.
func (c *Client) ImportTarget(tl pg.TimelineID) pageserver.ImportTarget {
	return importTarget{c: c, tl: tl}
}

type importTarget struct {
	c  *Client
	tl pg.TimelineID
}

func (t importTarget) Nblocks(ctx context.Context, rel pg.RelTag, lsn pg.LSN) (uint32, bool, error) {
	r, err := t.c.Nblocks(ctx, t.tl, []pg.RelTag{rel}, lsn, 0)
	if err != nil {
		return 0, false, err
	}
	return r[0].Nblocks, r[0].Exists, nil
}

func (t importTarget) SetRelSize(ctx context.Context, rel pg.RelTag, n uint32, w pg.LSN) error {
	return t.c.SetRelSize(ctx, t.tl, rel, n, w)
}

func (t importTarget) PutPages(ctx context.Context, ws []PageWrite, sizes ...SizeWrite) (pg.LSN, error) {
	a, err := t.c.PutPagesAck(ctx, t.tl, ws, sizes...)
	return a.Durable, err
}

func (t importTarget) WriteFile(ctx context.Context, path string, off int64, data []byte, w pg.LSN) error {
	return t.c.WriteFile(ctx, t.tl, path, off, data, w)
}

func (t importTarget) TruncateFile(ctx context.Context, path string, size int64, w pg.LSN) error {
	return t.c.TruncateFile(ctx, t.tl, path, size, w)
}
