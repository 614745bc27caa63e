package cache

import (
	"encoding/binary"

	"github.com/stratadb/strata/sdk/pg"
)

// PageLSN returns pd_lsn, the LSN in the header of a Postgres page (the
// first 8 bytes: xlogid then xrecoff, each a little-endian uint32 on the
// little-endian machines strata runs on). It is the natural lsn for Put:
// a pageserver fill that raced a newer write carries an older pd_lsn and is
// ignored, and a write that changed only hint bits (same pd_lsn) still
// overwrites. A new, all-zero page has pd_lsn 0 (pg.InvalidLSN), which
// always overwrites. It returns pg.InvalidLSN for a slice shorter than 8.
func PageLSN(page []byte) pg.LSN {
	if len(page) < 8 {
		return pg.InvalidLSN
	}
	hi := binary.LittleEndian.Uint32(page[0:4])
	lo := binary.LittleEndian.Uint32(page[4:8])
	return pg.LSN(uint64(hi)<<32 | uint64(lo))
}
