// Package stream is the safekeeper's Postgres replication client: it connects
// to a Postgres primary with the physical replication protocol, keeps a
// physical replication slot so that Postgres retains WAL the safekeeper has not
// received, writes the WAL it receives into a walstore.Store, flushes it with
// group commit, and reports write and flush positions in standby status
// updates under an application_name, so that Postgres' synchronous
// replication (synchronous_standby_names = 'ANY 2 (sk1, sk2, sk3)') counts the
// safekeeper.
//
// It is not the election logic: it streams from whichever Postgres it is told
// to, and the caller cancels it when the term changes.
package stream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/internal/rawio"
	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrSystemMismatch: the Postgres system identifier differs from the one
	// the store's WAL belongs to.
	ErrSystemMismatch = errors.New("stream: Postgres system identifier does not match the stored WAL")
	// ErrAhead: the store holds WAL beyond Postgres' own flush position, so
	// streaming cannot continue without a truncation decided by an election.
	ErrAhead = errors.New("stream: safekeeper holds WAL beyond the Postgres flush position")
	// ErrEndOfStream: Postgres ended the replication stream (end of timeline
	// or shutdown).
	ErrEndOfStream = errors.New("stream: Postgres ended the replication stream")
	// ErrConnect: no replication connection could be made (Postgres not
	// up yet, or refusing the role); the cause is joined to it.
	ErrConnect = errors.New("stream: connect")
)

// Config says where and how to stream.
type Config struct {
	// ConnString is a libpq-style URL or DSN of the Postgres primary, as a
	// user with the REPLICATION attribute.
	ConnString string
	// AppName is sent as application_name; synchronous_standby_names lists it.
	AppName string
	// Slot is the physical replication slot name (created when missing).
	Slot string
	// StatusInterval bounds the time between standby status updates when no
	// WAL arrives (default 1s; keep it well below wal_sender_timeout).
	StatusInterval time.Duration
	// NoOverlap starts streaming exactly at the local write LSN instead of
	// re-receiving and comparing the last segment.
	NoOverlap bool
	// RawSocket makes the replication socket's reads and writes raw system
	// calls (internal/rawio), which skip the Go runtime's system-call
	// bookkeeping; the network poller still waits, deadlines hold.
	RawSocket bool
	Logger    zerolog.Logger
}

// Observer receives progress; its methods are called from the flusher
// goroutine and must not block.
type Observer interface {
	// Flushed reports a completed group-commit flush: the new flush LSN and
	// the end of WAL on the Postgres server as last reported by it.
	Flushed(flush, serverEnd pg.LSN)
}

// Run streams WAL from Postgres into st until ctx is done or the
// connection fails; it returns ctx.Err() after cancellation.
//
// REQUIRES: nothing else writes to st while Run runs.
func Run(ctx context.Context, cfg Config, st *walstore.Store, obs Observer) error {
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = time.Second
	}
	log := cfg.Logger
	pcfg, err := pgconn.ParseConfig(cfg.ConnString)
	if err != nil {
		return fmt.Errorf("stream: parse connection string: %w", err)
	}
	pcfg.RuntimeParams["replication"] = "true"
	if cfg.RawSocket && pcfg.DialFunc != nil {
		dial := pcfg.DialFunc
		pcfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return rawio.WrapConn(c), nil
		}
	}
	if cfg.AppName != "" {
		pcfg.RuntimeParams["application_name"] = cfg.AppName
	}
	conn, err := pgconn.ConnectConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConnect, err)
	}
	defer conn.Close(context.Background())

	sys, err := pglogrepl.IdentifySystem(ctx, conn)
	if err != nil {
		return fmt.Errorf("stream: IDENTIFY_SYSTEM: %w", err)
	}
	sysID, err := strconv.ParseUint(sys.SystemID, 10, 64)
	if err != nil {
		return fmt.Errorf("stream: system identifier %q: %w", sys.SystemID, err)
	}
	if id := st.Control().SystemID; id != 0 && id != sysID {
		return fmt.Errorf("%w: Postgres has %d, the store %d", ErrSystemMismatch, sysID, id)
	}
	restart, err := ensureSlot(ctx, conn, cfg.Slot, log)
	if err != nil {
		return err
	}
	if st.IsEmpty() {
		// Start at the beginning of the segment that holds the slot's
		// restart LSN, so that every local segment is complete from its
		// first byte (as in pg_wal).
		seg := st.SegmentSize()
		start := pg.LSN(uint64(restart) / seg * seg)
		if err := st.Init(start, sysID, pg.PGTimeline(sys.Timeline)); err != nil {
			return err
		}
		log.Info().Str("start_lsn", start.String()).Uint64("system_id", sysID).Msg("safekeeper: initialized empty WAL store")
	}
	held := st.WriteLSN()
	start := held
	if !cfg.NoOverlap {
		// Re-receive the tail (up to one segment) and compare it: Postgres
		// rewrites a partially flushed last record after a crash, so the
		// local tail may differ from what Postgres now has; the first
		// differing byte is where the local copy is truncated.
		seg := st.SegmentSize()
		start = max(st.StartLSN(), pg.LSN((uint64(held)-1)/seg*seg))
		if held == st.StartLSN() {
			start = held
		}
	}
	if serverFlush := pg.LSN(sys.XLogPos); start > serverFlush {
		return fmt.Errorf("%w: safekeeper at %s, Postgres at %s", ErrAhead, start, serverFlush)
	}
	err = pglogrepl.StartReplication(ctx, conn, cfg.Slot, pglogrepl.LSN(start), pglogrepl.StartReplicationOptions{
		Mode: pglogrepl.PhysicalReplication, Timeline: sys.Timeline,
	})
	if err != nil {
		return fmt.Errorf("stream: START_REPLICATION at %s: %w", start, err)
	}
	log.Info().Str("start_lsn", start.String()).Str("server_flush", pg.LSN(sys.XLogPos).String()).Msg("safekeeper: streaming from Postgres")

	hc, err := conn.Hijack()
	if err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	s := &session{cfg: cfg, st: st, obs: obs, nc: hc.Conn, fe: hc.Frontend, kick: make(chan struct{}, 1), overlapEnd: held, received: start}
	defer hc.Conn.Close()
	return s.run(ctx)
}

// ensureSlot creates the physical slot (reserving WAL) unless it exists and
// returns its restart LSN.
//
// A slot can exist without a restart LSN: Postgres writes a new slot's
// state file once before it reserves WAL and once after, and a crash
// between the two (on strata, a compute killed before its writes reached
// the pageserver) leaves the first; a slot that max_slot_wal_keep_size
// invalidated has none either. Such a slot holds no WAL for anybody, so it
// is dropped and created again, which reserves WAL from Postgres' redo
// pointer. Before, the stream failed on it at every reconnect, and the
// safekeeper never streamed from that Postgres.
func ensureSlot(ctx context.Context, conn *pgconn.PgConn, slot string, log zerolog.Logger) (pg.LSN, error) {
	for attempt := 0; ; attempt++ {
		_, err := conn.Exec(ctx, fmt.Sprintf("CREATE_REPLICATION_SLOT %s PHYSICAL RESERVE_WAL", slot)).ReadAll()
		var pgErr *pgconn.PgError
		if err != nil && !(errors.As(err, &pgErr) && pgErr.Code == "42710") { // duplicate_object
			return 0, fmt.Errorf("stream: create slot %s: %w", slot, err)
		}
		res, err := conn.Exec(ctx, fmt.Sprintf("READ_REPLICATION_SLOT %s", slot)).ReadAll()
		if err != nil {
			return 0, fmt.Errorf("stream: read slot %s: %w", slot, err)
		}
		if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 2 {
			return 0, fmt.Errorf("stream: slot %s: unexpected READ_REPLICATION_SLOT reply", slot)
		}
		if r := res[0].Rows[0][1]; r != nil {
			lsn, err := pg.ParseLSN(string(r))
			if err != nil {
				return 0, fmt.Errorf("stream: slot %s: %w", slot, err)
			}
			return lsn, nil
		}
		if attempt > 0 {
			return 0, fmt.Errorf("stream: slot %s has no restart LSN, even created again", slot)
		}
		log.Warn().Str("slot", slot).Msg("safekeeper: replication slot without a restart LSN (a crash while Postgres created it, or invalidated); dropping and creating it again")
		if _, err := conn.Exec(ctx, fmt.Sprintf("DROP_REPLICATION_SLOT %s", slot)).ReadAll(); err != nil {
			return 0, fmt.Errorf("stream: drop slot %s, which has no restart LSN: %w", slot, err)
		}
	}
}

type session struct {
	cfg  Config
	st   *walstore.Store
	obs  Observer
	nc   net.Conn
	fe   *pgproto3.Frontend
	kick chan struct{}

	// overlapEnd: WAL below it is already held; incoming bytes there are
	// compared, not written.
	overlapEnd pg.LSN

	wmu       sync.Mutex // serializes writes to nc
	mu        sync.Mutex
	serverEnd pg.LSN
	// received is the end of the WAL received on this connection: the
	// local copy matches Postgres up to it. Status reports never go past
	// it, so that a local tail that Postgres has since rewritten (held,
	// not yet compared) acknowledges nothing.
	received pg.LSN
}

func (s *session) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 2)
	go func() { errc <- s.receive() }()
	go func() { errc <- s.flushLoop(ctx) }()
	var err error
	left := 2
	select {
	case err = <-errc:
		left--
	case <-ctx.Done():
		err = ctx.Err()
	}
	cancel()
	s.nc.Close() // unblocks the receiver
	// Wait for both: the caller may close the store once this returns, and
	// a flush still under way would then finish on a closed store (before,
	// only one was waited for when ctx ended first).
	for ; left > 0; left-- {
		<-errc
	}
	return err
}

func (s *session) receive() error {
	for {
		msg, err := s.fe.Receive()
		if err != nil {
			return fmt.Errorf("stream: receive: %w", err)
		}
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("stream: %w", err)
				}
				if err := s.write(pg.LSN(x.WALStart), x.WALData); err != nil {
					return err
				}
				s.mu.Lock()
				s.received = max(s.received, pg.LSN(x.WALStart)+pg.LSN(len(x.WALData)))
				s.serverEnd = max(s.serverEnd, pg.LSN(x.ServerWALEnd))
				s.mu.Unlock()
				s.poke()
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("stream: %w", err)
				}
				s.mu.Lock()
				s.serverEnd = max(s.serverEnd, pg.LSN(k.ServerWALEnd))
				s.mu.Unlock()
				if k.ReplyRequested {
					s.poke()
				}
			}
		case *pgproto3.CopyDone:
			return ErrEndOfStream
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("stream: %w", pgconn.ErrorResponseToPgError(m))
		}
	}
}

// write stores WAL at lsn, comparing the part below overlapEnd with the
// local copy and truncating the local copy at the first difference.
func (s *session) write(lsn pg.LSN, data []byte) error {
	for lsn < s.overlapEnd && len(data) > 0 {
		local, err := s.st.Read(lsn, min(len(data), int(s.overlapEnd-lsn)))
		if err != nil {
			if errors.Is(err, walstore.ErrCorrupt) {
				// Not comparable; the bytes are re-verified and repaired
				// elsewhere. Skip this chunk.
				n := min(len(data), int(s.overlapEnd-lsn), walstore.BlockSize-int(lsn%walstore.BlockSize))
				lsn, data = lsn+pg.LSN(n), data[n:]
				continue
			}
			if errors.Is(err, walstore.ErrNotHeld) {
				// Unflushed local bytes (no Flush ran since Open): nothing
				// durable to keep; rewrite from here.
				if err := s.st.Truncate(lsn); err != nil {
					return err
				}
				s.overlapEnd = lsn
				break
			}
			return err
		}
		i := 0
		for i < len(local) && local[i] == data[i] {
			i++
		}
		if i < len(local) {
			at := lsn + pg.LSN(i)
			s.cfg.Logger.Warn().Str("lsn", at.String()).Str("local_end", s.overlapEnd.String()).
				Msg("safekeeper: local WAL tail differs from Postgres; truncating it")
			if err := s.st.Truncate(at); err != nil {
				return err
			}
			s.overlapEnd = at
			lsn, data = at, data[i:]
			break
		}
		lsn, data = lsn+pg.LSN(len(local)), data[len(local):]
	}
	// Bytes equal so far: the local copy past this chunk is compared
	// against the next one (a chunk ending below overlapEnd is not the end
	// of Postgres' WAL).
	if len(data) == 0 {
		return nil
	}
	return s.st.Write(lsn, data)
}

func (s *session) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// flushLoop is the group commit: each round flushes everything received so
// far (while the receiver keeps writing) and then acknowledges it.
func (s *session) flushLoop(ctx context.Context) error {
	t := time.NewTicker(s.cfg.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.kick:
		case <-t.C:
		}
		flush, err := s.st.Flush()
		if err != nil {
			return err
		}
		s.mu.Lock()
		received := s.received
		s.mu.Unlock()
		if err := s.sendStatus(min(s.st.WriteLSN(), received), min(flush, received)); err != nil {
			return err
		}
		if s.obs != nil {
			s.mu.Lock()
			end := s.serverEnd
			s.mu.Unlock()
			s.obs.Flushed(flush, end)
		}
	}
}

func (s *session) sendStatus(write, flush pg.LSN) error {
	data := make([]byte, 0, 34)
	data = append(data, pglogrepl.StandbyStatusUpdateByteID)
	data = be64(data, uint64(write))
	data = be64(data, uint64(flush))
	data = be64(data, uint64(flush)) // apply: a safekeeper applies nothing; report flush
	data = be64(data, uint64(time.Since(pgEpoch).Microseconds()))
	data = append(data, 0)
	buf, err := (&pgproto3.CopyData{Data: data}).Encode(nil)
	if err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if _, err := s.nc.Write(buf); err != nil {
		return fmt.Errorf("stream: send status: %w", err)
	}
	return nil
}

var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func be64(b []byte, v uint64) []byte {
	return append(b, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}
