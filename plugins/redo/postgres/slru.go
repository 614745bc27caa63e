package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// SLRU names a simple-LRU file set whose 8 KiB pages WAL changes without
// block references.
type SLRU uint8

// The SLRUs redo maintains.
const (
	SLRUXact             SLRU = iota // pg_xact: commit status
	SLRUMultiXactOffsets             // pg_multixact/offsets
	SLRUMultiXactMembers             // pg_multixact/members
)

// String returns the SLRU's directory under PGDATA.
func (s SLRU) String() string {
	switch s {
	case SLRUXact:
		return "pg_xact"
	case SLRUMultiXactOffsets:
		return "pg_multixact/offsets"
	case SLRUMultiXactMembers:
		return "pg_multixact/members"
	}
	return fmt.Sprintf("slru%d", uint8(s))
}

// SLRUPages gives redo the SLRU pages to change. Page returns page pageno
// of s (pg.BlockSize bytes, changed in place), or nil when it does not
// exist; with zero set it returns the page zeroed, creating it if needed.
type SLRUPages interface {
	Page(s SLRU, pageno uint32, zero bool) []byte
}

// Multixact layout (multixact.c).
const (
	mxOffsetsPerPage  = 8192 / 4
	mxMembersPerGroup = 4
	mxGroupSize       = 4 + 4*mxMembersPerGroup
	mxGroupsPerPage   = 8192 / mxGroupSize
	mxMembersPerPage  = mxGroupsPerPage * mxMembersPerGroup
)

// RedoSLRU applies the SLRU changes of record r: commit status from
// Transaction records, CLOG ZEROPAGE, MultiXact ZERO_OFF_PAGE,
// ZERO_MEM_PAGE and CREATE_ID. Records without SLRU changes are no-ops
// (truncations remove whole segments: the caller's business).
func RedoSLRU(r *wal.Record, pages SLRUPages) error {
	switch r.RmID {
	case wal.RmCLOG:
		if pn, ok := CLOGZeroPage(r); ok {
			pages.Page(SLRUXact, pn, true)
		}
		return nil
	case wal.RmXact:
		ch, ok, err := XactStatusChange(r)
		if err != nil || !ok {
			return err
		}
		for _, x := range ch.XIDs {
			pn := CLOGPageOf(x)
			p := pages.Page(SLRUXact, pn, false)
			if p == nil {
				return fmt.Errorf("%w: %s at %s: pg_xact page %d missing", errRecord, RecordName(r), r.LSN, pn)
			}
			SetXactStatus(ch, pn, p)
		}
		return nil
	case wal.RmMultiXact:
		return redoMultiXact(r, pages)
	}
	return nil
}

func redoMultiXact(r *wal.Record, pages SLRUPages) error {
	m := r.MainData
	switch r.RmInfo() {
	case 0x00, 0x10: // ZERO_OFF_PAGE, ZERO_MEM_PAGE
		if len(m) < 4 {
			return errShort
		}
		s := SLRUMultiXactOffsets
		if r.RmInfo() == 0x10 {
			s = SLRUMultiXactMembers
		}
		pages.Page(s, binary.LittleEndian.Uint32(m), true)
		return nil
	case 0x20: // CREATE_ID
		if len(m) < 12 {
			return errShort
		}
		multi, offset := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint32(m[4:])
		n := int(int32(binary.LittleEndian.Uint32(m[8:])))
		if n < 0 || len(m) < 12+8*n {
			return errShort
		}
		put := func(s SLRU, pn uint32, off int, v uint32) error {
			p := pages.Page(s, pn, false)
			if p == nil {
				return fmt.Errorf("%w: %s at %s: %s page %d missing", errRecord, RecordName(r), r.LSN, s, pn)
			}
			binary.LittleEndian.PutUint32(p[off:], v)
			return nil
		}
		if err := put(SLRUMultiXactOffsets, multi/mxOffsetsPerPage, int(multi%mxOffsetsPerPage)*4, offset); err != nil {
			return err
		}
		next := multi + 1
		if next < 1 {
			next = 1
		}
		nextOff := offset + uint32(n)
		if nextOff == 0 {
			nextOff = 1
		}
		npn := next / mxOffsetsPerPage
		if npn != multi/mxOffsetsPerPage && pages.Page(SLRUMultiXactOffsets, npn, false) == nil {
			pages.Page(SLRUMultiXactOffsets, npn, true) // recovery initializes the next page
		}
		if err := put(SLRUMultiXactOffsets, npn, int(next%mxOffsetsPerPage)*4, nextOff); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			o := offset + uint32(i)
			xid, status := binary.LittleEndian.Uint32(m[12+8*i:]), binary.LittleEndian.Uint32(m[16+8*i:])
			pn := o / mxMembersPerPage
			flagsOff := int((o/mxMembersPerGroup)%mxGroupsPerPage) * mxGroupSize
			shift := (o % mxMembersPerGroup) * 8
			p := pages.Page(SLRUMultiXactMembers, pn, false)
			if p == nil {
				return fmt.Errorf("%w: %s at %s: members page %d missing", errRecord, RecordName(r), r.LSN, pn)
			}
			binary.LittleEndian.PutUint32(p[flagsOff+4+int(o%mxMembersPerGroup)*4:], xid)
			f := binary.LittleEndian.Uint32(p[flagsOff:])
			f = f&^(0xff<<shift) | status<<shift
			binary.LittleEndian.PutUint32(p[flagsOff:], f)
		}
		return nil
	case 0x30: // TRUNCATE_ID removes segments
		return nil
	}
	return unsupported(r)
}
