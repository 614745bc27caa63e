package walingest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/stratadb/strata/core/pageserver/ingest"
	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// unlink returns the tombstones that remove non-relation files at lsn
// (the record's end), for those that exist.
func (in *Ingester) unlink(ctx context.Context, lsn pg.LSN, paths ...string) ([]timeline.Change, error) {
	var cs []timeline.Change
	for _, path := range paths {
		size, ok, err := in.TL.StatFile(ctx, path, timeline.LatestLSN)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		cs = append(cs, timeline.Change{Key: keyspace.FileMeta(path), LSN: lsn, Kind: layer.Tombstone})
		for blk := int64(0); blk*pg.BlockSize < size; blk++ {
			cs = append(cs, timeline.Change{Key: keyspace.FileBlock(path, uint32(blk)), LSN: lsn, Kind: layer.Tombstone})
		}
	}
	return cs, nil
}

// fileOps returns the relation changes of a record's file-level operations
// and appends to extra, files and raw the page images, file blocks and
// other versions they imply.
func (in *Ingester) fileOps(ctx context.Context, r *wal.Record, ops []postgres.FileOp, tr postgres.Truncation, isTrunc bool, dropped []pg.RelTag, extra *[]ingest.BlockChange, files *[]ingest.FileBlock, raw *[]timeline.Change) ([]ingest.RelChange, error) {
	var out []ingest.RelChange
	for _, op := range ops {
		switch op.Kind {
		case "create-fork":
			_, exists, err := in.TL.Nblocks(ctx, op.Rel, timeline.LatestLSN)
			if err != nil {
				return nil, err
			}
			if !exists {
				out = append(out, ingest.RelChange{Rel: op.Rel, Nblocks: 0})
			}
		case "create-database":
			if op.SrcDB != 0 {
				cs, err := in.copyDatabase(ctx, r.EndLSN, op)
				if err != nil {
					return nil, err
				}
				*raw = append(*raw, cs...)
				continue
			}
			// WAL_LOG strategy: the pages follow as images; the redo of this
			// record creates the database directory and its PG_VERSION.
			for _, spc := range op.Spcs {
				if spc == defaultTablespace {
					*files = append(*files, ingest.FileBlock{Path: fmt.Sprintf("base/%d/PG_VERSION", op.DB), Data: []byte("15\n")})
				}
			}
		case "drop-database":
			for _, spc := range op.Spcs {
				rels, err := in.TL.ListRels(ctx, keyspace.DBRange(spc, op.DB), timeline.LatestLSN)
				if err != nil {
					return nil, err
				}
				for _, rel := range rels {
					out = append(out, ingest.RelChange{Rel: rel, Drop: true})
				}
				if spc == defaultTablespace {
					cs, err := in.unlink(ctx, r.EndLSN, fmt.Sprintf("base/%d/PG_VERSION", op.DB), relMapPath(spc, op.DB))
					if err != nil {
						return nil, err
					}
					*raw = append(*raw, cs...)
				}
			}
		}
	}
	// A committed DROP (or an aborted CREATE) removes every fork.
	for _, rel := range dropped {
		for fork := pg.MainFork; fork <= pg.InitFork; fork++ {
			f := rel
			f.Fork = fork
			_, exists, err := in.TL.Nblocks(ctx, f, timeline.LatestLSN)
			if err != nil {
				return nil, err
			}
			if exists {
				out = append(out, ingest.RelChange{Rel: f, Drop: true})
			}
		}
	}
	if isTrunc {
		rcs, err := in.truncate(ctx, tr, extra)
		if err != nil {
			return nil, err
		}
		out = append(out, rcs...)
	}
	return out, nil
}

// truncate applies an SMGR TRUNCATE: the main fork, and, as smgr_redo
// does, the free space map and the visibility map of the relation.
func (in *Ingester) truncate(ctx context.Context, tr postgres.Truncation, extra *[]ingest.BlockChange) ([]ingest.RelChange, error) {
	var out []ingest.RelChange
	if tr.Flags&postgres.TruncateHeap != 0 {
		out = append(out, ingest.RelChange{Rel: tr.Rel, Nblocks: tr.Blocks})
	}
	if tr.Flags&postgres.TruncateFSM != 0 {
		fsm := tr.Rel
		fsm.Fork = pg.FSMFork
		n, exists, err := in.TL.Nblocks(ctx, fsm, timeline.LatestLSN)
		if err != nil {
			return nil, err
		}
		if nb, ok := fsmBlocksAfterTruncate(tr.Blocks, n); exists && ok {
			out = append(out, ingest.RelChange{Rel: fsm, Nblocks: nb})
		}
	}
	if tr.Flags&postgres.TruncateVM != 0 {
		vm := tr.Rel
		vm.Fork = pg.VMFork
		n, exists, err := in.TL.Nblocks(ctx, vm, timeline.LatestLSN)
		if err != nil {
			return nil, err
		}
		nb, partial := postgres.VMBlocksAfterTruncate(tr.Blocks)
		if exists && nb < n {
			out = append(out, ingest.RelChange{Rel: vm, Nblocks: nb})
		}
		if exists && partial && nb-1 < n {
			// visibilitymap_prepare_truncate clears the bits of the cut
			// heap blocks in the last VM page, without WAL of its own.
			pk := vm.Page(nb - 1)
			p, err := in.TL.Get(ctx, keyspace.RelBlock(pk), timeline.LatestLSN)
			switch {
			case errors.Is(err, timeline.ErrNotFound) || errors.Is(err, timeline.ErrMissingBase):
				// The page is not here: nothing to clear.
			case err != nil:
				return nil, err
			default:
				img := bytes.Clone(p)
				postgres.VMTruncatePage(img, tr.Blocks)
				*extra = append(*extra, ingest.BlockChange{Page: pk, Kind: layer.Image, Data: img})
			}
		}
	}
	return out, nil
}

// Free space map geometry (fsm_internals.h, freespace.c): leaf slots per
// FSM page, and a tree of three levels.
const (
	fsmSlotsPerPage = pg.BlockSize - 24 - 4 - (pg.BlockSize/2 - 1)
	fsmTreeDepth    = 3
)

// fsmLogicalToPhysical is freespace.c's fsm_logical_to_physical for a
// bottom-level page.
func fsmLogicalToPhysical(logpageno uint32) uint32 {
	leafno := logpageno
	pages := uint32(0)
	for l := 0; l < fsmTreeDepth; l++ {
		pages += leafno + 1
		leafno /= fsmSlotsPerPage
	}
	return pages - 1
}

// fsmBlocksAfterTruncate is FreeSpaceMapPrepareTruncateRel's answer: the
// FSM's new size when the heap shrinks to heapBlocks and the FSM has
// fsmBlocks blocks, and false when the FSM does not shrink.
func fsmBlocksAfterTruncate(heapBlocks, fsmBlocks uint32) (uint32, bool) {
	logpage, slot := heapBlocks/fsmSlotsPerPage, heapBlocks%fsmSlotsPerPage
	phys := fsmLogicalToPhysical(logpage)
	if slot > 0 {
		// The page holding the first removed slot stays (its tail is
		// cleared, which the FSM tolerates not being replayed here).
		if phys >= fsmBlocks {
			return 0, false
		}
		return phys + 1, true
	}
	if fsmBlocks <= phys {
		return 0, false
	}
	return phys, true
}

// copyDatabase returns what CREATE DATABASE with the FILE_COPY strategy
// does: every relation key of the template database (pages and sizes) and
// its PG_VERSION and pg_filenode.map, as they are at the record, written
// under the new database at the record's end LSN.
func (in *Ingester) copyDatabase(ctx context.Context, lsn pg.LSN, op postgres.FileOp) ([]timeline.Change, error) {
	if op.SrcSpc != defaultTablespace || len(op.Spcs) != 1 || op.Spcs[0] != defaultTablespace {
		return nil, fmt.Errorf("%w: CREATE DATABASE with the FILE_COPY strategy in tablespace %d (from %d) at %s", ErrUnsupported, op.Spcs, op.SrcSpc, lsn)
	}
	var cs []timeline.Change
	src := keyspace.DBRange(op.SrcSpc, op.SrcDB)
	rels, err := in.TL.ListRels(ctx, src, timeline.LatestLSN)
	if err != nil {
		return nil, err
	}
	live := make(map[pg.RelTag]bool, len(rels))
	for _, r := range rels {
		live[r] = true
	}
	err = in.TL.ScanKeys(ctx, src, timeline.LatestLSN, func(k keyspace.Key) error {
		if !live[k.Rel()] {
			return nil // pages of a dropped relation
		}
		nk := k
		binary.BigEndian.PutUint32(nk[1:], op.Spcs[0])
		binary.BigEndian.PutUint32(nk[5:], op.DB)
		d, err := in.TL.Get(ctx, k, timeline.LatestLSN)
		if errors.Is(err, timeline.ErrNotFound) {
			if k.IsRelBlock() {
				// A block that reads as zeros (a compute's page of
				// zeros is a tombstone): copied as one, so that pages
				// of an earlier database with the same OID never show
				// through.
				cs = append(cs, timeline.Change{Key: nk, LSN: lsn, Kind: layer.Tombstone})
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("walingest: copying %s of database %d: %w", k, op.SrcDB, err)
		}
		cs = append(cs, timeline.Change{Key: nk, LSN: lsn, Kind: layer.Image, Data: d})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, name := range []string{"PG_VERSION", "pg_filenode.map"} {
		src := fmt.Sprintf("base/%d/%s", op.SrcDB, name)
		d, err := in.TL.ReadFile(ctx, src, timeline.LatestLSN)
		if errors.Is(err, timeline.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		dst := fmt.Sprintf("base/%d/%s", op.DB, name)
		for blk := 0; blk*pg.BlockSize < len(d); blk++ {
			end := min(len(d), (blk+1)*pg.BlockSize)
			cs = append(cs, timeline.Change{Key: keyspace.FileBlock(dst, uint32(blk)), LSN: lsn, Kind: layer.Image, Data: d[blk*pg.BlockSize : end]})
		}
		cs = append(cs, timeline.Change{Key: keyspace.FileMeta(dst), LSN: lsn, Kind: layer.Image, Data: timeline.FileMetaValue(dst, int64(len(d)))})
	}
	return cs, nil
}

// xactDroppedRels returns the relations (main forks) whose files a
// Transaction COMMIT or ABORT record (or their PREPARED forms) removes:
// the relations a committed transaction dropped, or those an aborted one
// created (xl_xact_relfilenodes).
func xactDroppedRels(r *wal.Record) ([]pg.RelTag, error) {
	op := r.Info & 0x70
	if r.RmID != wal.RmXact || (op != 0x00 && op != 0x20 && op != 0x30 && op != 0x40) || r.Info&0x80 == 0 {
		return nil, nil
	}
	d := r.MainData
	bad := func() error {
		return fmt.Errorf("%w: %s at %s truncated", ErrUnsupported, postgres.RecordName(r), r.LSN)
	}
	if len(d) < 12 {
		return nil, bad()
	}
	xinfo := binary.LittleEndian.Uint32(d[8:])
	d = d[12:]
	if xinfo&(1<<0) != 0 { // dbinfo
		if len(d) < 8 {
			return nil, bad()
		}
		d = d[8:]
	}
	if xinfo&(1<<1) != 0 { // subxacts
		if len(d) < 4 {
			return nil, bad()
		}
		n := int(int32(binary.LittleEndian.Uint32(d)))
		if n < 0 || len(d) < 4+4*n {
			return nil, bad()
		}
		d = d[4+4*n:]
	}
	if xinfo&(1<<2) == 0 { // relfilenodes
		return nil, nil
	}
	if len(d) < 4 {
		return nil, bad()
	}
	n := int(int32(binary.LittleEndian.Uint32(d)))
	if n < 0 || len(d) < 4+12*n {
		return nil, bad()
	}
	out := make([]pg.RelTag, n)
	for i := range out {
		b := d[4+12*i:]
		out[i] = pg.RelTag{Spc: binary.LittleEndian.Uint32(b), DB: binary.LittleEndian.Uint32(b[4:]), Rel: binary.LittleEndian.Uint32(b[8:])}
	}
	return out, nil
}
