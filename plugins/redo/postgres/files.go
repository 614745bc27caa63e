package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// SMGR truncate flags (storage_xlog.h).
const (
	TruncateHeap = 0x0001
	TruncateVM   = 0x0002
	TruncateFSM  = 0x0004
)

// Truncation is an SMGR TRUNCATE record: the main fork of Rel shrinks to
// Blocks blocks (when Flags has TruncateHeap), and its VM and FSM with it.
type Truncation struct {
	Rel    pg.RelTag // main fork
	Blocks uint32
	Flags  uint32
}

// SMGRTruncation decodes an SMGR TRUNCATE record; ok is false for others.
func SMGRTruncation(r *wal.Record) (tr Truncation, ok bool, err error) {
	if r.RmID != wal.RmSmgr || r.RmInfo() != 0x20 {
		return tr, false, nil
	}
	m := r.MainData
	if len(m) < 20 {
		return tr, false, fmt.Errorf("%w: %s at %s", errShort, RecordName(r), r.LSN)
	}
	tr.Blocks = binary.LittleEndian.Uint32(m)
	tr.Rel = pg.RelTag{Spc: binary.LittleEndian.Uint32(m[4:]), DB: binary.LittleEndian.Uint32(m[8:]), Rel: binary.LittleEndian.Uint32(m[12:])}
	tr.Flags = binary.LittleEndian.Uint32(m[16:])
	return tr, true, nil
}

// VMBlocksAfterTruncate returns how many VM pages remain when the heap
// shrinks to heapBlocks, and the VM page (if any) whose tail
// VMTruncatePage must clear.
func VMBlocksAfterTruncate(heapBlocks uint32) (vmBlocks uint32, partial bool) {
	b := heapBlocks / heapBlocksPerVMPage
	if heapBlocks%heapBlocksPerVMPage != 0 {
		return b + 1, true
	}
	return b, false
}

// VMTruncatePage is visibilitymap_prepare_truncate's change to the last
// remaining VM page (block heapBlocks / heap blocks per VM page): the bits
// of heap blocks at and beyond heapBlocks are cleared. The page LSN does
// not change.
func VMTruncatePage(pg8k []byte, heapBlocks uint32) {
	hb := heapBlocks % heapBlocksPerVMPage
	truncByte, truncOff := int(hb/4), (hb%4)*2
	mapArea := pg8k[pageHeaderSize:]
	clear(mapArea[truncByte+1:])
	mapArea[truncByte] &= byte(1<<truncOff) - 1
}

// RelMapUpdate is a RelMap UPDATE record: the new pg_filenode.map of a
// database (DB 0 with the global tablespace: global/pg_filenode.map).
type RelMapUpdate struct {
	DB, Spc uint32
	File    []byte // the whole file, 512 bytes in PostgreSQL 15
}

// RelMap decodes a RelMap UPDATE record; ok is false for other records.
func RelMap(r *wal.Record) (u RelMapUpdate, ok bool, err error) {
	if r.RmID != wal.RmRelMap {
		return u, false, nil
	}
	if r.RmInfo() != 0x00 {
		return u, false, unsupported(r)
	}
	m := r.MainData
	if len(m) < 12 {
		return u, false, errShort
	}
	n := int(int32(binary.LittleEndian.Uint32(m[8:])))
	if n != 512 || len(m) < 12+n {
		return u, false, fmt.Errorf("%w: relmap update of %d bytes at %s", errRecord, n, r.LSN)
	}
	return RelMapUpdate{DB: binary.LittleEndian.Uint32(m), Spc: binary.LittleEndian.Uint32(m[4:]), File: m[12 : 12+n]}, true, nil
}

// FileOp is a file-level change a record makes: the pageserver, not page
// redo, applies it (create a relation fork, create or drop a database).
type FileOp struct {
	Kind string    // "create-fork", "create-database", "drop-database"
	Rel  pg.RelTag // create-fork: the fork created (empty)
	DB   uint32    // databases
	Spcs []uint32  // tablespaces of the database
	// Copy-strategy CREATE DATABASE copies every file of SrcDB; the
	// WAL_LOG strategy logs the new database's pages as FPIs instead.
	SrcDB, SrcSpc uint32
}

// FileOps decodes the file-level operations of SMGR CREATE and Database
// CREATE_FILE_COPY, CREATE_WAL_LOG and DROP records (SMGR TRUNCATE has
// SMGRTruncation). Other records return nil.
func FileOps(r *wal.Record) ([]FileOp, error) {
	m := r.MainData
	short := func() error { return fmt.Errorf("%w: %s at %s", errShort, RecordName(r), r.LSN) }
	switch r.RmID {
	case wal.RmSmgr:
		if r.RmInfo() != 0x10 {
			return nil, nil
		}
		if len(m) < 16 {
			return nil, short()
		}
		return []FileOp{{Kind: "create-fork", Rel: pg.RelTag{Spc: binary.LittleEndian.Uint32(m), DB: binary.LittleEndian.Uint32(m[4:]),
			Rel: binary.LittleEndian.Uint32(m[8:]), Fork: pg.ForkNumber(binary.LittleEndian.Uint32(m[12:]))}}}, nil
	case wal.RmDatabase:
		switch r.RmInfo() {
		case 0x00: // CREATE_FILE_COPY
			if len(m) < 16 {
				return nil, short()
			}
			return []FileOp{{Kind: "create-database", DB: binary.LittleEndian.Uint32(m), Spcs: []uint32{binary.LittleEndian.Uint32(m[4:])},
				SrcDB: binary.LittleEndian.Uint32(m[8:]), SrcSpc: binary.LittleEndian.Uint32(m[12:])}}, nil
		case 0x10: // CREATE_WAL_LOG
			if len(m) < 8 {
				return nil, short()
			}
			return []FileOp{{Kind: "create-database", DB: binary.LittleEndian.Uint32(m), Spcs: []uint32{binary.LittleEndian.Uint32(m[4:])}}}, nil
		case 0x20: // DROP
			if len(m) < 8 {
				return nil, short()
			}
			n := int(int32(binary.LittleEndian.Uint32(m[4:])))
			if n < 0 || len(m) < 8+4*n {
				return nil, short()
			}
			op := FileOp{Kind: "drop-database", DB: binary.LittleEndian.Uint32(m)}
			for i := 0; i < n; i++ {
				op.Spcs = append(op.Spcs, binary.LittleEndian.Uint32(m[8+4*i:]))
			}
			return []FileOp{op}, nil
		}
	}
	return nil, nil
}
