// Package archive uploads a safekeeper's WAL segments to the object store:
// every full segment below the commit LSN, once, under
// <prefix>/<system id>/<segment name>, and after a quiet period the partial
// last segment as <segment name>.partial (replaced as it grows). It also
// reads WAL back (Fetch), which `strata wal fetch` uses as Postgres'
// restore_command.
//
// It never deletes anything: local WAL removal is the node's decision.
package archive

import (
	"bytes"
	"context"
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
	Logger       zerolog.Logger
	Now          func() time.Time
}

// Archiver uploads segments from a walstore.Store. Step is called from one
// goroutine at a time.
type Archiver struct {
	o  Options
	st *walstore.Store

	lastCommit  pg.LSN
	lastChange  time.Time
	partialDone pg.LSN
}

// New returns an archiver of st.
func New(o Options, st *walstore.Store) *Archiver {
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Archiver{o: o, st: st}
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
	ctl := a.st.Control()
	seg := a.st.SegmentSize()
	limit := min(commit, ctl.FlushLSN)
	archived := max(ctl.ArchivedLSN, ctl.StartLSN)
	archived = pg.LSN(uint64(archived) / seg * seg)
	for uint64(archived)+seg <= uint64(limit) {
		no := uint64(archived) / seg
		name := walstore.SegmentName(ctl.Timeline, no, seg)
		data, err := a.read(archived, archived+pg.LSN(seg))
		if err != nil {
			return archived, err
		}
		err = a.o.Store.Put(ctx, Key(a.o.Prefix, ctl.SystemID, name, false), bytes.NewReader(data),
			objectstore.PutOptions{IfNotExists: true, Size: int64(len(data))})
		if err != nil && !errors.Is(err, objectstore.ErrExists) {
			return archived, fmt.Errorf("archive: upload %s: %w", name, err)
		}
		// A partial copy of this segment is superseded now.
		if err := a.o.Store.Delete(ctx, Key(a.o.Prefix, ctl.SystemID, name, true)); err != nil {
			a.o.Logger.Warn().Err(err).Str("segment", name).Msg("archive: delete superseded partial segment")
		}
		archived += pg.LSN(seg)
		next := archived
		if err := a.st.UpdateControl(func(c *walstore.Control) { c.ArchivedLSN = max(c.ArchivedLSN, next) }); err != nil {
			return archived, err
		}
		a.o.Logger.Debug().Str("segment", name).Msg("archive: uploaded segment")
	}
	now := a.o.Now()
	if limit != a.lastCommit {
		a.lastCommit, a.lastChange = limit, now
	}
	if a.o.PartialAfter > 0 && limit > archived && limit > a.partialDone && now.Sub(a.lastChange) >= a.o.PartialAfter {
		name := walstore.SegmentName(ctl.Timeline, uint64(archived)/seg, seg)
		data, err := a.read(archived, limit)
		if err != nil {
			return archived, err
		}
		if err := a.o.Store.Put(ctx, Key(a.o.Prefix, ctl.SystemID, name, true), bytes.NewReader(data),
			objectstore.PutOptions{Size: int64(len(data))}); err != nil {
			return archived, fmt.Errorf("archive: upload %s.partial: %w", name, err)
		}
		a.partialDone = limit
		a.o.Logger.Debug().Str("segment", name).Str("end", limit.String()).Msg("archive: uploaded partial segment")
	}
	return archived, nil
}

func (a *Archiver) read(from, to pg.LSN) ([]byte, error) {
	out := make([]byte, 0, to-from)
	for p := from; p < to; {
		b, err := a.st.Read(p, int(to-p))
		if err != nil {
			return nil, err
		}
		if len(b) == 0 {
			return nil, fmt.Errorf("archive: no WAL at %s", p)
		}
		out = append(out, b...)
		p += pg.LSN(len(b))
	}
	return out, nil
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
