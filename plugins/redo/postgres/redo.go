// Package postgres is strata's Go-native PostgreSQL 15 redo: it applies WAL
// records to 8 KiB pages byte for byte as Postgres' own redo routines do,
// masks pages the way wal_consistency_checking compares them, and dumps WAL
// like pg_waldump. Decoding lives in the wal subpackage.
//
// It does not read or write relation files, keep page versions or decide
// when to materialize images: the pageserver and image policies do that
// through the sdk/redo contract, which Engine implements.
package postgres

import (
	"errors"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

var (
	errRecord = errors.New("postgres: malformed record data")
	errShort  = fmt.Errorf("%w: block data too short", errRecord)
)

// RecordName returns "Rmgr/TYPE" for a record, as pg_waldump --stats=record
// names it.
func RecordName(r *wal.Record) string {
	id, ok := wal.Identify(r.RmID, r.Info)
	if !ok {
		id = fmt.Sprintf("UNKNOWN (%x)", r.RmInfo())
	}
	return r.RmID.String() + "/" + id
}

// xlogFPIForHint is XLOG_FPI_FOR_HINT.
const xlogFPIForHint = 0xA0

func unsupported(r *wal.Record) error {
	return fmt.Errorf("%w: %s at %s", redo.ErrUnsupported, RecordName(r), r.LSN)
}

// Options tune redo to the cluster's settings.
type Options struct {
	// HintBitsLogged is XLogHintBitIsNeeded(): data checksums or
	// wal_log_hints are on. It decides whether some records set page LSNs.
	HintBitsLogged bool
}

// RedoBlock applies record r to the page of its block reference blk.
// page holds the version before r (it may be all zeros when the block is
// initialized by r, or absent on disk) and is changed in place. An image
// that the record says to apply is restored instead of redoing. Records
// that strata cannot redo return an error wrapping redo.ErrUnsupported that
// names the record type; malformed data returns another error; neither
// leaves the page in a defined state.
func RedoBlock(r *wal.Record, blk *wal.BlockRef, pg8k []byte, opts Options) (err error) {
	if len(pg8k) != pg.BlockSize {
		return fmt.Errorf("postgres: page of %d bytes", len(pg8k))
	}
	defer func() {
		if e := recover(); e != nil {
			err = fmt.Errorf("%w: %s at %s: %v", errRecord, RecordName(r), r.LSN, e)
		}
	}()
	p := page(pg8k)
	if blk.ApplyImage {
		if err := blk.RestoreImage(pg8k); err != nil {
			return fmt.Errorf("%s at %s: %w", RecordName(r), r.LSN, err)
		}
		if !p.isNew() {
			p.setLSN(r.EndLSN)
		}
		if r.RmID == wal.RmGist {
			gistAfterImage(r, blk, p)
		}
		return nil
	}
	if blk.WillInit() {
		// Redo builds the page from scratch; never trust the old bytes.
		clear(pg8k)
	}
	switch r.RmID {
	case wal.RmHeap:
		err = redoHeap(r, blk, p)
	case wal.RmHeap2:
		err = redoHeap2(r, blk, p, opts.HintBitsLogged)
	case wal.RmBtree:
		err = redoBtree(r, blk, p)
	case wal.RmSequence:
		err = redoSequence(r, blk, p)
	case wal.RmBRIN:
		err = redoBrin(r, blk, p)
	case wal.RmHash:
		err = redoHash(r, blk, p)
	case wal.RmGist:
		err = redoGist(r, blk, p)
	case wal.RmGin:
		err = redoGin(r, blk, p)
	case wal.RmSPGist:
		err = redoSPGist(r, blk, p)
	case wal.RmGeneric:
		if err = redoGeneric(blk, p); err == nil {
			p.setLSN(r.EndLSN)
		}
	case wal.RmXLOG:
		// FPI carries an applied image (handled above). FPI_FOR_HINT
		// carries none when full_page_writes is off (wal_log_hints or
		// checksums on): Postgres' xlog_redo skips such a block, the
		// page and its LSN stay as they are.
		if r.RmInfo() == xlogFPIForHint {
			return nil
		}
		err = unsupported(r)
	default:
		err = unsupported(r)
	}
	if err != nil && !errors.Is(err, redo.ErrUnsupported) {
		err = fmt.Errorf("%s at %s, %s: %w", RecordName(r), r.LSN, blk.Page, err)
	}
	return err
}

func redoSequence(r *wal.Record, blk *wal.BlockRef, p page) error {
	if r.RmInfo() != 0 {
		return unsupported(r)
	}
	if err := needMain(r, 12); err != nil {
		return err
	}
	p.init(4)
	p.put32(p.special(), 0x1717) // SEQ_MAGIC
	if err := p.addItem(r.MainData[12:], 1, false, false); err != nil {
		return err
	}
	p.setLSN(r.EndLSN)
	return nil
}
