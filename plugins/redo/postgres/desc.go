package postgres

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

func u16(b []byte, off int) uint16 {
	if off+2 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint16(b[off:])
}

func u32(b []byte, off int) uint32 {
	if off+4 > len(b) {
		return 0
	}
	return binary.LittleEndian.Uint32(b[off:])
}

func u8(b []byte, off int) uint8 {
	if off >= len(b) {
		return 0
	}
	return b[off]
}

func infobits(b *strings.Builder, bits uint8) {
	for _, f := range []struct {
		bit  uint8
		name string
	}{{0x01, "IS_MULTI "}, {0x02, "LOCK_ONLY "}, {0x04, "EXCL_LOCK "}, {0x08, "KEYSHR_LOCK "}, {0x10, "KEYS_UPDATED "}} {
		if bits&f.bit != 0 {
			b.WriteString(f.name)
		}
	}
}

// Describe returns the description pg_waldump prints after a record's type
// for heap, heap2, btree, sequence, storage, checkpoint, NEXTOID, standby
// LOCK and RUNNING_XACTS records; other record types (transaction commits
// among them) get an empty description.
func Describe(r *wal.Record) string {
	m := r.MainData
	var b strings.Builder
	info := r.RmInfo()
	switch r.RmID {
	case wal.RmHeap:
		switch info & 0x70 {
		case 0x00:
			fmt.Fprintf(&b, "off %d flags 0x%02X", u16(m, 0), u8(m, 2))
		case 0x10:
			fmt.Fprintf(&b, "off %d flags 0x%02X ", u16(m, 4), u8(m, 7))
			infobits(&b, u8(m, 6))
		case 0x20, 0x40:
			fmt.Fprintf(&b, "off %d xmax %d flags 0x%02X ", u16(m, 4), u32(m, 0), u8(m, 7))
			infobits(&b, u8(m, 6))
			fmt.Fprintf(&b, "; new off %d xmax %d", u16(m, 12), u32(m, 8))
		case 0x50, 0x70:
			fmt.Fprintf(&b, "off %d", u16(m, 0))
		case 0x60:
			fmt.Fprintf(&b, "off %d: xid %d: flags 0x%02X ", u16(m, 4), u32(m, 0), u8(m, 7))
			infobits(&b, u8(m, 6))
		}
	case wal.RmHeap2:
		switch info & 0x70 {
		case 0x10:
			fmt.Fprintf(&b, "latestRemovedXid %d nredirected %d ndead %d", u32(m, 0), u16(m, 4), u16(m, 6))
		case 0x20:
			fmt.Fprintf(&b, "nunused %d", u16(m, 0))
		case 0x30:
			fmt.Fprintf(&b, "cutoff xid %d ntuples %d", u32(m, 0), u16(m, 4))
		case 0x40:
			fmt.Fprintf(&b, "cutoff xid %d flags 0x%02X", u32(m, 0), u8(m, 4))
		case 0x50:
			fmt.Fprintf(&b, "%d tuples flags 0x%02X", u16(m, 2), u8(m, 0))
		case 0x60:
			fmt.Fprintf(&b, "off %d: xmax %d: flags 0x%02X ", u16(m, 4), u32(m, 0), u8(m, 7))
			infobits(&b, u8(m, 6))
		}
	case wal.RmBtree:
		switch info {
		case 0x00, 0x10, 0x20, 0x50:
			fmt.Fprintf(&b, "off %d", u16(m, 0))
		case 0x30, 0x40:
			fmt.Fprintf(&b, "level %d, firstrightoff %d, newitemoff %d, postingoff %d", u32(m, 0), u16(m, 4), u16(m, 6), u16(m, 8))
		case 0x60:
			fmt.Fprintf(&b, "nintervals %d", u16(m, 0))
		case 0xC0:
			fmt.Fprintf(&b, "ndeleted %d; nupdated %d", u16(m, 0), u16(m, 2))
		case 0x70:
			fmt.Fprintf(&b, "latestRemovedXid %d; ndeleted %d; nupdated %d", u32(m, 0), u16(m, 4), u16(m, 6))
		case 0xB0:
			fmt.Fprintf(&b, "topparent %d; leaf %d; left %d; right %d", u32(m, 16), u32(m, 4), u32(m, 8), u32(m, 12))
		case 0x80, 0x90:
			fmt.Fprintf(&b, "left %d; right %d; level %d; safexid %d:%d; ", u32(m, 0), u32(m, 4), u32(m, 8), u32(m, 20), u32(m, 16))
			fmt.Fprintf(&b, "leafleft %d; leafright %d; leaftopparent %d", u32(m, 24), u32(m, 28), u32(m, 32))
		case 0xA0:
			fmt.Fprintf(&b, "lev %d", u32(m, 4))
		case 0xD0:
			fmt.Fprintf(&b, "rel %d/%d/%d; latestRemovedXid %d:%d", u32(m, 0), u32(m, 4), u32(m, 8), u32(m, 20), u32(m, 16))
		case 0xE0:
			if len(r.Blocks) > 0 {
				d := r.Blocks[0].Data
				fmt.Fprintf(&b, "last_cleanup_num_delpages %d", u32(d, 20))
			}
		}
	case wal.RmXLOG:
		switch info {
		case 0x00, 0x10: // CHECKPOINT_SHUTDOWN, CHECKPOINT_ONLINE
			fpw, kind := "false", "online"
			if u8(m, 16) != 0 {
				fpw = "true"
			}
			if info == 0x00 {
				kind = "shutdown"
			}
			fmt.Fprintf(&b, "redo %X/%X; tli %d; prev tli %d; fpw %s; xid %d:%d; oid %d; multi %d; offset %d; "+
				"oldest xid %d in DB %d; oldest multi %d in DB %d; oldest/newest commit timestamp xid: %d/%d; oldest running xid %d; %s",
				u32(m, 4), u32(m, 0), u32(m, 8), u32(m, 12), fpw, u32(m, 28), u32(m, 24), u32(m, 32), u32(m, 36), u32(m, 40),
				u32(m, 44), u32(m, 48), u32(m, 52), u32(m, 56), u32(m, 72), u32(m, 76), u32(m, 80), kind)
		case 0x30: // NEXTOID
			fmt.Fprintf(&b, "%d", u32(m, 0))
		}
	case wal.RmStandby:
		if info == 0x00 { // LOCK
			n := int(int32(u32(m, 0)))
			for i := 0; i < n && len(m) >= 4+12*(i+1); i++ {
				fmt.Fprintf(&b, "xid %d db %d rel %d ", u32(m, 4+12*i), u32(m, 8+12*i), u32(m, 12+12*i))
			}
		}
		if info == 0x10 { // RUNNING_XACTS
			xcnt := int(int32(u32(m, 0)))
			fmt.Fprintf(&b, "nextXid %d latestCompletedXid %d oldestRunningXid %d", u32(m, 12), u32(m, 20), u32(m, 16))
			if xcnt > 0 && len(m) >= 24+4*xcnt {
				fmt.Fprintf(&b, "; %d xacts:", xcnt)
				for i := 0; i < xcnt; i++ {
					fmt.Fprintf(&b, " %d", u32(m, 24+4*i))
				}
			}
			if u8(m, 8) != 0 {
				b.WriteString("; subxid ovf")
			}
		}
	case wal.RmSequence:
		if info == 0 {
			fmt.Fprintf(&b, "rel %d/%d/%d", u32(m, 0), u32(m, 4), u32(m, 8))
		}
	case wal.RmSmgr:
		switch info {
		case 0x10:
			b.WriteString(relPath(u32(m, 0), u32(m, 4), u32(m, 8), u32(m, 12)))
		case 0x20:
			fmt.Fprintf(&b, "%s to %d blocks flags %d", relPath(u32(m, 4), u32(m, 8), u32(m, 12), 0), u32(m, 0), u32(m, 16))
		}
	}
	return b.String()
}

func relPath(spc, db, rel, fork uint32) string {
	var s string
	switch spc {
	case 1664:
		s = fmt.Sprintf("global/%d", rel)
	case 1663:
		s = fmt.Sprintf("base/%d/%d", db, rel)
	default:
		s = fmt.Sprintf("pg_tblspc/%d/PG_15_202209061/%d/%d", spc, db, rel)
	}
	switch fork {
	case 1:
		s += "_fsm"
	case 2:
		s += "_vm"
	case 3:
		s += "_init"
	}
	return s
}
