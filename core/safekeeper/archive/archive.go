// Package archive uploads a safekeeper's WAL segments to the object store:
// every full segment below the commit LSN, once, under
// <prefix>/<system id>/<segment name>, and after a quiet period the partial
// last segment as <segment name>.partial (replaced as it grows). It also
// reads WAL back (Fetch), which `strata wal fetch` uses as Postgres'
// restore_command.
//
// In a group, each segment has one owner (segment number modulo the group
// size picks the safekeeper by rank), which uploads it. The others check
// that the object is there (Stat) and count it archived; only when it is
// still missing Takeover after they could have uploaded it (the owner is
// down or behind) do they upload it themselves. So the group reads,
// writes and sends each segment once instead of once per safekeeper.
//
// It never deletes anything: local WAL removal is the node's decision.
package archive

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// Options configure an Archiver.
type Options struct {
	Store        objectstore.Store
	Prefix       string
	PartialAfter time.Duration // 0: never upload partial segments
	// PartialEvery uploads the partial last segment this often while
	// commits go on and never leave PartialAfter of quiet (0: only after
	// quiet). It bounds what a restore from the object store alone misses
	// after the loss of every safekeeper's disk. The segment's owner
	// uploads on this schedule; the other members look at its copy as
	// often and upload in its place when the copy has not grown for
	// PartialEvery plus Takeover.
	PartialEvery time.Duration
	// Rank and GroupSize place this safekeeper in its group (rank 0 ..
	// GroupSize-1, the same order on every member); GroupSize <= 1 uploads
	// every segment.
	Rank, GroupSize int
	// Takeover is how long a segment another member owns may stay missing
	// from the store before this one uploads it (default 30 s).
	Takeover time.Duration
	// FinalStagger spaces the members' uploads of the partial segment as
	// they stop together (Final): the segment's owner first, the next
	// rank FinalStagger later, and so on, so that each sees what the
	// earlier ones put and a shorter copy never replaces a longer one
	// (default 500 ms).
	FinalStagger time.Duration
	Logger       zerolog.Logger
	Now          func() time.Time
}

// DefaultTakeover is Options.Takeover's default.
const DefaultTakeover = 30 * time.Second

// Archiver uploads segments from a walstore.Store. Step is called from one
// goroutine at a time.
type Archiver struct {
	o  Options
	st *walstore.Store

	lastCommit  pg.LSN
	lastChange  time.Time
	partialDone pg.LSN
	partialAt   time.Time // the last partial upload (or New)

	// A member that does not own the last segment watches the owner's
	// partial copy (ownerSilent): when it looked last, and the copy's
	// size and since when it has been that.
	peekAt    time.Time
	seenSeg   uint64
	seenSize  int64
	seenSince time.Time

	waiting map[uint64]time.Time // segments other members own, missing from the store since
	inStore map[uint64]bool      // segments past a gap known to be in the store
	buf     []byte               // read buffer (read)
	checked bool                 // checkStore ran
}

// New returns an archiver of st.
func New(o Options, st *walstore.Store) *Archiver {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Takeover <= 0 {
		o.Takeover = DefaultTakeover
	}
	return &Archiver{o: o, st: st, partialAt: o.Now(), waiting: map[uint64]time.Time{}, inStore: map[uint64]bool{}}
}

// Key returns the object key of a segment (partial: with ".partial").
func Key(prefix string, systemID uint64, segName string, partial bool) string {
	k := fmt.Sprintf("%d/%s", systemID, segName)
	if prefix != "" {
		k = prefix + "/" + k
	}
	if partial {
		k += ".partial"
	}
	return k
}

// Step uploads what is due, up to commit (quorum-durable WAL only), and
// returns the archived LSN (all WAL below it is in the object store).
func (a *Archiver) Step(ctx context.Context, commit pg.LSN) (pg.LSN, error) {
	return a.step(ctx, commit, false)
}

// Ping asks the object store one cheap question (objectstore.Ping).
func (a *Archiver) Ping(ctx context.Context) error {
	return objectstore.Ping(ctx, a.o.Store)
}

// Final is the step a safekeeper takes as it stops: Step, then the
// partial last segment uploaded at once, without waiting for
// PartialAfter of quiet, unless the store already holds as much of it
// (another member, stopping too, may have put a longer copy, which is
// kept; the members take turns, see Options.FinalStagger). A cluster
// stopped cleanly then has all its WAL in the object
// store, for a restore from the store alone. With PartialAfter 0
// (partial segments off) it is Step.
func (a *Archiver) Final(ctx context.Context, commit pg.LSN) (pg.LSN, error) {
	return a.step(ctx, commit, true)
}

func (a *Archiver) step(ctx context.Context, commit pg.LSN, final bool) (pg.LSN, error) {
	if !a.checked {
		if err := a.checkStore(ctx); err != nil {
			return 0, err
		}
		a.checked = true
	}
	ctl := a.st.Control()
	seg := a.st.SegmentSize()
	limit := min(commit, ctl.FlushLSN)
	archived := max(ctl.ArchivedLSN, ctl.StartLSN)
	archived = pg.LSN(uint64(archived) / seg * seg)
	// Past a segment still missing (its owner's turn), this member goes on
	// with the segments it owns; archived stops at the first gap.
	gap := false
	for p := archived; uint64(p)+seg <= uint64(limit); p += pg.LSN(seg) {
		done, err := a.segment(ctx, ctl, p, final)
		if err != nil {
			return archived, err
		}
		if !done {
			gap = true
			continue
		}
		if gap {
			continue
		}
		archived = p + pg.LSN(seg)
		next := archived
		if err := a.st.UpdateControl(func(c *walstore.Control) { c.ArchivedLSN = max(c.ArchivedLSN, next) }); err != nil {
			return archived, err
		}
	}
	for no := range a.waiting {
		if no < uint64(archived)/seg {
			delete(a.waiting, no)
		}
	}
	for no := range a.inStore {
		if no < uint64(archived)/seg {
			delete(a.inStore, no)
		}
	}
	if gap {
		return archived, nil
	}
	now := a.o.Now()
	if limit != a.lastCommit {
		a.lastCommit, a.lastChange = limit, now
	}
	quiet := a.o.PartialAfter
	owner := a.owns(uint64(archived) / seg)
	if !owner {
		quiet += a.o.Takeover // the owner's job, unless it is gone
	}
	name := walstore.SegmentName(ctl.Timeline, uint64(archived)/seg, seg)
	key := Key(a.o.Prefix, ctl.SystemID, name, true)
	wanted := a.o.PartialAfter > 0 && limit > archived && limit > a.partialDone
	due := final || now.Sub(a.lastChange) >= quiet
	if wanted && !due && a.o.PartialEvery > 0 {
		if owner {
			due = now.Sub(a.partialAt) >= a.o.PartialEvery
		} else if now.Sub(a.peekAt) >= a.o.PartialEvery {
			var err error
			if due, err = a.ownerSilent(ctx, key, uint64(archived)/seg, int64(limit-archived), now); err != nil {
				return archived, err
			}
		}
	}
	if wanted && due {
		if final {
			if err := a.waitTurn(ctx, uint64(archived)/seg); err != nil {
				return archived, err
			}
			if oi, err := a.o.Store.Stat(ctx, key); err == nil && oi.Size >= int64(limit-archived) {
				a.partialDone = limit
				return archived, nil
			}
		}
		if err := a.o.Store.Put(ctx, key, a.read(archived, limit),
			objectstore.PutOptions{Size: int64(limit - archived)}); err != nil {
			return archived, fmt.Errorf("archive: upload %s.partial: %w", name, err)
		}
		a.partialDone, a.partialAt = limit, now
		a.seenSeg, a.seenSize, a.seenSince = uint64(archived)/seg, int64(limit-archived), now
		a.o.Logger.Debug().Str("segment", name).Str("end", limit.String()).Msg("archive: uploaded partial segment")
	}
	return archived, nil
}

// ownerSilent is a member's look, once per PartialEvery, at the partial
// copy of segment no, which the segment's owner replaces every
// PartialEvery while commits go on. It reports true when the copy is
// shorter than want (this member's WAL of the segment) and has not
// changed for PartialEvery plus Takeover: the owner is down or cut off,
// and this member uploads in its place, as for whole segments.
func (a *Archiver) ownerSilent(ctx context.Context, key string, no uint64, want int64, now time.Time) (bool, error) {
	a.peekAt = now
	var size int64
	oi, err := a.o.Store.Stat(ctx, key)
	switch {
	case err == nil:
		size = oi.Size
	case !errors.Is(err, objectstore.ErrNotFound):
		return false, fmt.Errorf("archive: stat %s: %w", key, err)
	}
	if no != a.seenSeg || size != a.seenSize {
		since := now
		if a.seenSince.IsZero() {
			since = a.partialAt // the first look: unchanged since New, as far as this member knows
		}
		a.seenSeg, a.seenSize, a.seenSince = no, size, since
		return false, nil
	}
	return size < want && now.Sub(a.seenSince) >= a.o.PartialEvery+a.o.Takeover, nil
}

// PartialLSN returns the end of the partial segment this archiver last
// put into the store, or found there as long (0: none). Called from the
// goroutine that calls Step.
func (a *Archiver) PartialLSN() pg.LSN { return a.partialDone }

// checkStore runs before the first step. The control file's archived LSN
// is about the store this safekeeper archived to, and the configured store
// may not be that one any more (objectstore changed in the config, a bucket
// emptied). When the last segment counted archived is missing from the
// store, the archived LSN goes back to the start of local WAL: the steps
// then archive again what is still here (each member its own segments, as
// always) and local WAL is not removed meanwhile. WAL below the start of
// local WAL is only in the old store, which the log says.
func (a *Archiver) checkStore(ctx context.Context) error {
	ctl := a.st.Control()
	seg := a.st.SegmentSize()
	if uint64(ctl.ArchivedLSN) < seg {
		return nil
	}
	last := pg.LSN(uint64(ctl.ArchivedLSN)/seg*seg - seg)
	name := walstore.SegmentName(ctl.Timeline, uint64(last)/seg, seg)
	there, err := a.stored(ctx, Key(a.o.Prefix, ctl.SystemID, name, false), int64(seg))
	if err != nil || there {
		return err
	}
	start := pg.LSN(uint64(ctl.StartLSN) / seg * seg)
	log := a.o.Logger.Warn().Str("segment", name).Str("archived_lsn", ctl.ArchivedLSN.String())
	log = log.Str("local_wal_from", ctl.StartLSN.String())
	if start >= ctl.ArchivedLSN {
		log.Msg("archive: the last segment archived is missing from the object store (was objectstore changed in the config, or the store emptied?); it is no longer on local disk either: WAL archived before is only in the old store")
		return nil
	}
	log.Msg("archive: the last segment archived is missing from the object store (was objectstore changed in the config, or the store emptied?): archiving the local WAL again; WAL archived below local_wal_from is only in the old store")
	return a.st.UpdateControl(func(c *walstore.Control) { c.ArchivedLSN = start })
}

// segment archives the full segment at p, or finds it in the store: it
// reports whether the segment is in the store now. A segment another
// member owns is left to it until Takeover has passed.
func (a *Archiver) segment(ctx context.Context, ctl walstore.Control, p pg.LSN, final bool) (bool, error) {
	seg := a.st.SegmentSize()
	no := uint64(p) / seg
	name := walstore.SegmentName(ctl.Timeline, no, seg)
	key := Key(a.o.Prefix, ctl.SystemID, name, false)
	if a.inStore[no] {
		return true, nil
	}
	// A Stat before the upload costs far less than reading and sending a
	// segment that is there already (another member took over, or this
	// one uploaded it past a gap before a restart).
	there, err := a.stored(ctx, key, int64(seg))
	if err != nil || there {
		delete(a.waiting, no)
		a.inStore[no] = there
		return there, err
	}
	// At a stop (final) no member waits for the owner, which is stopping
	// too: the conditional create lets one upload win.
	if !a.owns(no) && !final {
		since, ok := a.waiting[no]
		if !ok {
			a.waiting[no] = a.o.Now()
			return false, nil
		}
		if a.o.Now().Sub(since) < a.o.Takeover {
			return false, nil // the owner's turn
		}
		a.o.Logger.Info().Str("segment", name).Dur("waited", a.o.Now().Sub(since)).
			Msg("archive: the segment's owner did not upload it; uploading it here")
	}
	err = a.o.Store.Put(ctx, key, a.read(p, p+pg.LSN(seg)), objectstore.PutOptions{IfNotExists: true, Size: int64(seg)})
	if err != nil && !errors.Is(err, objectstore.ErrExists) {
		return false, fmt.Errorf("archive: upload %s: %w", name, err)
	}
	delete(a.waiting, no)
	a.inStore[no] = true
	// A partial copy of this segment is superseded now.
	if err := a.o.Store.Delete(ctx, Key(a.o.Prefix, ctl.SystemID, name, true)); err != nil {
		a.o.Logger.Warn().Err(err).Str("segment", name).Msg("archive: delete superseded partial segment")
	}
	a.o.Logger.Debug().Str("segment", name).Msg("archive: uploaded segment")
	return true, nil
}

// waitTurn waits for this member's turn to put the partial copy of
// segment no at a stop (see Options.FinalStagger).
func (a *Archiver) waitTurn(ctx context.Context, no uint64) error {
	if a.o.GroupSize <= 1 {
		return nil
	}
	stagger := a.o.FinalStagger
	if stagger == 0 {
		stagger = 500 * time.Millisecond
	}
	turn := (a.o.Rank - int(no%uint64(a.o.GroupSize)) + a.o.GroupSize) % a.o.GroupSize
	select {
	case <-time.After(time.Duration(turn) * stagger):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// owns reports whether this member uploads segment no first.
func (a *Archiver) owns(no uint64) bool {
	return a.o.GroupSize <= 1 || int(no%uint64(a.o.GroupSize)) == a.o.Rank
}

// stored reports whether the object store holds key with size bytes.
func (a *Archiver) stored(ctx context.Context, key string, size int64) (bool, error) {
	oi, err := a.o.Store.Stat(ctx, key)
	if errors.Is(err, objectstore.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("archive: stat %s: %w", key, err)
	}
	if oi.Size != size {
		return false, fmt.Errorf("archive: %s holds %d bytes, want %d", key, oi.Size, size)
	}
	return true, nil
}

func (a *Archiver) read(from, to pg.LSN) io.Reader {
	if a.buf == nil {
		a.buf = make([]byte, readChunk)
	}
	return &walReader{st: a.st, pos: from, to: to, buf: a.buf}
}

// readChunk is the archiver's read size: one buffer of it, reused, rather
// than a 16 MiB allocation (and its zeroing) per segment.
const readChunk = 1 << 20

// walReader reads verified WAL in [pos, to) from a store, a chunk at a
// time into buf.
type walReader struct {
	st      *walstore.Store
	pos, to pg.LSN
	buf     []byte
	chunk   []byte // read, not yet returned
}

func (r *walReader) Read(p []byte) (int, error) {
	if len(r.chunk) == 0 {
		if r.pos >= r.to {
			return 0, io.EOF
		}
		var err error
		if r.chunk, err = r.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, r.chunk)
	r.chunk = r.chunk[n:]
	return n, nil
}

// next reads the next chunk: into buf from a block start, else (after a
// short read that ended inside a block) a fresh slice.
func (r *walReader) next() ([]byte, error) {
	var b []byte
	if r.pos%walstore.BlockSize == 0 {
		n, err := r.st.ReadInto(r.pos, r.buf)
		if err != nil {
			return nil, err
		}
		b = r.buf[:n]
	} else {
		var err error
		if b, err = r.st.Read(r.pos, int(r.to-r.pos)); err != nil {
			return nil, err
		}
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("archive: no WAL at %s", r.pos)
	}
	b = b[:min(len(b), int(r.to-r.pos))]
	r.pos += pg.LSN(len(b))
	return b, nil
}

// Fetch writes segment segName (full, or else the partial copy padded with
// zeros to segSize, as Postgres expects of a segment) from the object store
// to w. It returns objectstore.ErrNotFound when neither exists.
func Fetch(ctx context.Context, store objectstore.Store, prefix string, systemID uint64, segName string, segSize int64, w io.Writer) error {
	r, err := store.Get(ctx, Key(prefix, systemID, segName, false))
	partial := false
	if errors.Is(err, objectstore.ErrNotFound) {
		r, err = store.Get(ctx, Key(prefix, systemID, segName, true))
		partial = true
	}
	if err != nil {
		return err
	}
	defer r.Close()
	n, err := io.Copy(w, r)
	if err != nil {
		return fmt.Errorf("archive: fetch %s: %w", segName, err)
	}
	if partial && n < segSize {
		if _, err := io.CopyN(w, zeroReader{}, segSize-n); err != nil {
			return err
		}
	}
	return nil
}

// ReadSegment reads back the archived segment that holds lsn, whole (for
// a WAL stream from below the store's start LSN), and returns its first
// LSN and name. Only a full segment counts: a partial copy is not all of
// the segment's WAL. A segment not in the archive is walstore.ErrNotHeld;
// an object that is not that segment of this cluster (its first page
// header: magic, page address, system identifier) is walstore.ErrCorrupt,
// not WAL that a consumer would read as its end.
func (a *Archiver) ReadSegment(ctx context.Context, lsn pg.LSN) (pg.LSN, []byte, string, error) {
	ctl := a.st.Control()
	size := a.st.SegmentSize()
	no := uint64(lsn) / size
	start := pg.LSN(no * size)
	name := walstore.SegmentName(ctl.Timeline, no, size)
	r, err := a.o.Store.Get(ctx, Key(a.o.Prefix, ctl.SystemID, name, false))
	if errors.Is(err, objectstore.ErrNotFound) {
		return 0, nil, name, fmt.Errorf("%w: %s is below this safekeeper's WAL (from %s) and segment %s is not in the archive",
			walstore.ErrNotHeld, lsn, ctl.StartLSN, name)
	}
	if err != nil {
		return 0, nil, name, err
	}
	defer r.Close()
	buf, err := io.ReadAll(io.LimitReader(r, int64(size)+1))
	if err != nil {
		return 0, nil, name, fmt.Errorf("archive: read %s: %w", name, err)
	}
	if uint64(len(buf)) != size {
		return 0, nil, name, fmt.Errorf("%w: archived segment %s holds %d bytes, a segment is %d", walstore.ErrCorrupt, name, len(buf), size)
	}
	if err := checkSegmentStart(buf, start, ctl.SystemID); err != nil {
		return 0, nil, name, fmt.Errorf("%w: archived segment %s: %w", walstore.ErrCorrupt, name, err)
	}
	return start, buf, name, nil
}

// checkSegmentStart checks the long page header that starts a WAL
// segment (PostgreSQL 15: magic 0xD110, the page's own address, the
// cluster's system identifier).
func checkSegmentStart(seg []byte, start pg.LSN, systemID uint64) error {
	const longHeader = 40
	if len(seg) < longHeader {
		return fmt.Errorf("%d bytes, shorter than a page header", len(seg))
	}
	magic, addr, sys := binary.LittleEndian.Uint16(seg), pg.LSN(binary.LittleEndian.Uint64(seg[8:])), binary.LittleEndian.Uint64(seg[24:])
	switch {
	case magic != 0xD110:
		return fmt.Errorf("first page has magic %#04x, want 0xd110 (PostgreSQL 15 WAL)", magic)
	case addr != start:
		return fmt.Errorf("first page is at %s, want %s", addr, start)
	case systemID != 0 && sys != systemID:
		return fmt.Errorf("system identifier %d, this cluster's is %d", sys, systemID)
	}
	return nil
}

// SystemIDs lists the system identifiers with archived WAL under prefix.
func SystemIDs(ctx context.Context, store objectstore.Store, prefix string) ([]uint64, error) {
	seen := map[uint64]bool{}
	var out []uint64
	p := ""
	if prefix != "" {
		p = prefix + "/"
	}
	err := store.List(ctx, p, func(oi objectstore.ObjectInfo) error {
		var id uint64
		if _, err := fmt.Sscanf(oi.Key[len(p):], "%d/", &id); err == nil && !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
		return nil
	})
	return out, err
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}
