// Package ingest follows a timeline's WAL and feeds it, decoded into
// per-key changes, to the timeline engine (redo mode and fpi/pushdown
// image policies). It defines the narrow interfaces it needs from the WAL
// side, so that the safekeeper client and the WAL decoder plug in without
// this package knowing them: a Source of decoded records and a Feedback
// sink for the positions the safekeepers want back.
//
// It does not decode WAL and does not talk to safekeepers itself.
package ingest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// BlockChange is a WAL record's change to one relation page.
type BlockChange struct {
	Page pg.PageKey
	// Kind is layer.Image (a full page image), layer.Delta (Data is the
	// record, applied by the redo engine) or layer.WillInit (a record that
	// initializes the page).
	Kind layer.Kind
	Data []byte
}

// RelChange sets a relation fork's size (create, extend, truncate) or drops it.
type RelChange struct {
	Rel     pg.RelTag
	Nblocks uint32
	Drop    bool
}

// FileBlock is a new version of one block of a non-relation file (an SLRU
// page, pg_filenode.map, ...). With Kind layer.Image (or zero) Data is the
// block, pg.BlockSize bytes or shorter for a file smaller than a block;
// with layer.Delta Data is a record that the timeline's redo engine
// applies to the block's previous value (an SLRU change such as a commit's
// status bits), and the block must exist already.
type FileBlock struct {
	Path  string
	Block uint32
	Data  []byte
	Kind  layer.Kind
}

// Record is the effect of one WAL record. LSN is the record's end LSN: the
// versions are visible from it.
type Record struct {
	LSN    pg.LSN
	Blocks []BlockChange
	Rels   []RelChange
	Files  []FileBlock
	// Raw are further versions stored as they are, after the others (a
	// copied database's keys, an unlinked file's tombstones): in the same
	// batch, so that a crash keeps all of a record's effects or none.
	Raw []timeline.Change
}

// Source delivers decoded WAL of one timeline, in LSN order. Next blocks
// until at least one record or a newer end position is available and
// returns the records and the LSN up to which WAL is complete (at or after
// the last record's LSN). The caller owns the returned slices.
type Source interface {
	Next(ctx context.Context) ([]Record, pg.LSN, error)
	Close() error
}

// OpenFunc opens a Source that starts at (after) LSN start.
type OpenFunc func(ctx context.Context, tl pg.TimelineID, start pg.LSN) (Source, error)

// Feedback receives the timeline's positions after every ingested batch,
// for the safekeepers (which may delete WAL that is durable here and
// uploaded). Report must not block for long.
type Feedback interface {
	Report(tl pg.TimelineID, l timeline.LSNs)
}

// Apply turns records into changes and ingests them into tl, extending
// relation sizes when a block lies past the known end (as Postgres' redo
// does), and records that WAL up to end is ingested. The versions are
// durable when it returns.
func Apply(ctx context.Context, tl *timeline.Timeline, recs []Record, end pg.LSN) error {
	cs, err := Changes(ctx, tl, recs)
	if err != nil {
		return err
	}
	return tl.Ingest(ctx, cs, end)
}

// ApplyBuffered is Apply with timeline.IngestBuffered: the versions are
// durable only after tl.SyncIngested (LSNs().Durable says how far).
func ApplyBuffered(ctx context.Context, tl *timeline.Timeline, recs []Record, end pg.LSN) error {
	cs, err := Changes(ctx, tl, recs)
	if err != nil {
		return err
	}
	return tl.IngestBuffered(ctx, cs, end)
}

// Changes converts records into timeline changes, reading the relation
// and file sizes it needs from tl at the latest LSN.
func Changes(ctx context.Context, tl *timeline.Timeline, recs []Record) ([]timeline.Change, error) {
	n := 0
	for i := range recs {
		n += len(recs[i].Blocks) + len(recs[i].Rels) + len(recs[i].Files) + len(recs[i].Raw)
	}
	cs := make([]timeline.Change, 0, n+n/8)
	sizes := map[pg.RelTag]uint32{}
	known := map[pg.RelTag]bool{}
	fileSizes := map[string]int64{}
	size := func(r pg.RelTag) (uint32, error) {
		if known[r] {
			return sizes[r], nil
		}
		n, _, err := tl.Nblocks(ctx, r, timeline.LatestLSN)
		sizes[r], known[r] = n, true
		return n, err
	}
	for _, rec := range recs {
		for _, rc := range rec.Rels {
			if rc.Drop {
				cs = append(cs, timeline.Change{Key: keyspace.RelSize(rc.Rel), LSN: rec.LSN, Kind: layer.Tombstone})
				sizes[rc.Rel], known[rc.Rel] = 0, true
				continue
			}
			cs = append(cs, timeline.Change{Key: keyspace.RelSize(rc.Rel), LSN: rec.LSN, Kind: layer.Image, Data: timeline.RelSizeValue(rc.Nblocks)})
			sizes[rc.Rel], known[rc.Rel] = rc.Nblocks, true
		}
		for _, b := range rec.Blocks {
			cs = append(cs, timeline.Change{Key: keyspace.RelBlock(b.Page), LSN: rec.LSN, Kind: b.Kind, Data: b.Data})
			n, err := size(b.Page.Tag())
			if err != nil {
				return nil, err
			}
			if b.Page.Block >= n {
				sizes[b.Page.Tag()] = b.Page.Block + 1
				cs = append(cs, timeline.Change{Key: keyspace.RelSize(b.Page.Tag()), LSN: rec.LSN, Kind: layer.Image, Data: timeline.RelSizeValue(b.Page.Block + 1)})
			}
		}
		for _, f := range rec.Files {
			kind := f.Kind
			if kind == 0 {
				kind = layer.Image
			}
			if kind == layer.Delta {
				// A change to an existing block: the size stays.
				cs = append(cs, timeline.Change{Key: keyspace.FileBlock(f.Path, f.Block), LSN: rec.LSN, Kind: layer.Delta, Data: f.Data})
				continue
			}
			if kind != layer.Image {
				return nil, fmt.Errorf("ingest: file block of kind %s", kind)
			}
			if len(f.Data) > pg.BlockSize {
				return nil, fmt.Errorf("ingest: file block of %d bytes", len(f.Data))
			}
			cs = append(cs, timeline.Change{Key: keyspace.FileBlock(f.Path, f.Block), LSN: rec.LSN, Kind: layer.Image, Data: f.Data})
			cur, ok := fileSizes[f.Path]
			if !ok {
				s, _, err := tl.StatFile(ctx, f.Path, timeline.LatestLSN)
				if err != nil {
					return nil, err
				}
				cur = s
			}
			if end := int64(f.Block)*pg.BlockSize + int64(len(f.Data)); end > cur {
				cur = end
				cs = append(cs, timeline.Change{Key: keyspace.FileMeta(f.Path), LSN: rec.LSN, Kind: layer.Image, Data: timeline.FileMetaValue(f.Path, end)})
			}
			fileSizes[f.Path] = cur
		}
		cs = append(cs, rec.Raw...)
	}
	return cs, nil
}

// Follow ingests tl's WAL until ctx ends: it opens a Source at the
// timeline's last record LSN, applies what it delivers, reports positions
// to fb (may be nil), and reopens the Source with backoff after errors.
func Follow(ctx context.Context, tl *timeline.Timeline, open OpenFunc, fb Feedback, log zerolog.Logger) error {
	backoff := 100 * time.Millisecond
	for {
		start := tl.LSNs().LastRecord
		src, err := open(ctx, tl.ID(), start)
		if err == nil {
			err = follow(ctx, tl, src, fb)
			src.Close()
			if err == nil {
				backoff = 100 * time.Millisecond
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, timeline.ErrClosed) {
			return err
		}
		log.Warn().Err(err).Stringer("from", start).Dur("retry_in", backoff).Msg("WAL ingest interrupted")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

func follow(ctx context.Context, tl *timeline.Timeline, src Source, fb Feedback) error {
	for {
		recs, end, err := src.Next(ctx)
		if err != nil {
			return err
		}
		if err := Apply(ctx, tl, recs, end); err != nil {
			return err
		}
		if fb != nil {
			fb.Report(tl.ID(), tl.LSNs())
		}
	}
}
