package postgres

import (
	"encoding/binary"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

// Generic WAL redo: generic_xlog.c, the WAL of extensions that log whole
// page changes through GenericXLog (contrib's bloom index, pgvector's
// indexes and others). A block's data is a list of fragments, each an
// offset and a length (uint16 each) and that many bytes to copy to the
// page; a page logged whole is a full page image, restored before here.
func redoGeneric(blk *wal.BlockRef, p page) error {
	for d := blk.Data; len(d) > 0; {
		if len(d) < 4 {
			return errShort
		}
		off, n := int(binary.LittleEndian.Uint16(d)), int(binary.LittleEndian.Uint16(d[2:]))
		if len(d) < 4+n {
			return errShort
		}
		if off+n > len(p) {
			return fmt.Errorf("%w: generic fragment %d+%d past the page", errRecord, off, n)
		}
		copy(p[off:], d[4:4+n])
		d = d[4+n:]
	}
	// The delta says nothing of the hole; GenericXLogFinish zeroed it.
	lo, up := p.lower(), p.upper()
	if lo < pageHeaderSize || lo > up || up > len(p) {
		return fmt.Errorf("%w: generic page with pd_lower %d, pd_upper %d", errPage, lo, up)
	}
	clear(p[lo:up])
	return nil
}
