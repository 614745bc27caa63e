package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// Transaction status values stored in pg_xact (clog.h).
const (
	XactInProgress   = 0
	XactCommitted    = 1
	XactAborted      = 2
	XactSubCommitted = 3

	clogXactsPerPage = 8192 * 4
)

// CLOGPageOf returns the pg_xact page number that holds xid's status.
func CLOGPageOf(xid uint32) uint32 { return xid / clogXactsPerPage }

// XactStatus is a status change for a set of transactions.
type XactStatus struct {
	XIDs   []uint32 // the top-level xid first, then its subtransactions
	Status uint8
}

// XactStatusChange returns the pg_xact change a Transaction record makes
// (commit, abort, commit/abort prepared). ok is false for records that do
// not change commit status (assignment, prepare, invalidations).
func XactStatusChange(r *wal.Record) (ch XactStatus, ok bool, err error) {
	if r.RmID != wal.RmXact {
		return ch, false, nil
	}
	op := r.Info & 0x70
	switch op {
	case 0x00, 0x30: // COMMIT, COMMIT_PREPARED
		ch.Status = XactCommitted
	case 0x20, 0x40: // ABORT, ABORT_PREPARED
		ch.Status = XactAborted
	default:
		return ch, false, nil
	}
	d := r.MainData
	if len(d) < 8 {
		return ch, false, fmt.Errorf("%w: transaction record at %s too short", errRecord, r.LSN)
	}
	d = d[8:] // xact_time
	var xinfo uint32
	if r.Info&0x80 != 0 {
		if len(d) < 4 {
			return ch, false, errShort
		}
		xinfo = binary.LittleEndian.Uint32(d)
		d = d[4:]
	}
	need := func(n int) error {
		if n < 0 || len(d) < n {
			return fmt.Errorf("%w: transaction record at %s truncated", errRecord, r.LSN)
		}
		return nil
	}
	var subs []uint32
	if xinfo&(1<<0) != 0 { // dbinfo
		if err := need(8); err != nil {
			return ch, false, err
		}
		d = d[8:]
	}
	if xinfo&(1<<1) != 0 { // subxacts
		if err := need(4); err != nil {
			return ch, false, err
		}
		n := int(int32(binary.LittleEndian.Uint32(d)))
		if err := need(4 + 4*n); err != nil {
			return ch, false, err
		}
		for i := 0; i < n; i++ {
			subs = append(subs, binary.LittleEndian.Uint32(d[4+4*i:]))
		}
		d = d[4+4*n:]
	}
	skipArray := func(elem int) error {
		if err := need(4); err != nil {
			return err
		}
		n := int(int32(binary.LittleEndian.Uint32(d)))
		if err := need(4 + elem*n); err != nil {
			return err
		}
		d = d[4+elem*n:]
		return nil
	}
	if xinfo&(1<<2) != 0 { // relfilenodes
		if err := skipArray(12); err != nil {
			return ch, false, err
		}
	}
	if xinfo&(1<<8) != 0 { // dropped stats
		if err := skipArray(12); err != nil {
			return ch, false, err
		}
	}
	if xinfo&(1<<3) != 0 && ch.Status == XactCommitted { // invalidations (commit only)
		if err := skipArray(16); err != nil {
			return ch, false, err
		}
	}
	xid := r.XID
	if xinfo&(1<<4) != 0 { // two-phase
		if err := need(4); err != nil {
			return ch, false, err
		}
		xid = binary.LittleEndian.Uint32(d)
	}
	ch.XIDs = append([]uint32{xid}, subs...)
	return ch, true, nil
}

// SetXactStatus writes status into the pg_xact page pageno for every xid
// of ch on that page (a page is 8 KiB, two bits per transaction).
func SetXactStatus(ch XactStatus, pageno uint32, pg8k []byte) {
	for _, x := range ch.XIDs {
		if CLOGPageOf(x) != pageno {
			continue
		}
		i := x % clogXactsPerPage
		b, shift := i/4, (i%4)*2
		pg8k[b] = pg8k[b]&^(3<<shift) | ch.Status<<shift
	}
}

// CLOGZeroPage returns the page a CLOG ZEROPAGE record zeroes; ok is false
// for other records.
func CLOGZeroPage(r *wal.Record) (pageno uint32, ok bool) {
	if r.RmID != wal.RmCLOG || r.RmInfo() != 0x00 || len(r.MainData) < 4 {
		return 0, false
	}
	return binary.LittleEndian.Uint32(r.MainData), true
}
