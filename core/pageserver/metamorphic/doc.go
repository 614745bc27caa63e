// Package metamorphic holds strata's metamorphic test of the two page
// sources (DESIGN.md section 2): one PostgreSQL 15 workload runs once, on a
// FUSE mount over psbackend (writeback mode: the pageserver timeline holds
// the pages Postgres wrote), and the same WAL is ingested into a second
// timeline with the Go redo engine and the pushdown image policy (redo
// mode: every page rebuilt from WAL). At every checkpoint of the workload
// the two timelines must hold the same pages once masked as Postgres masks
// them for wal_consistency_checking, and a stock Postgres started from a
// basebackup of the redo timeline must answer the workload's queries as
// the original did.
//
// The package has no code of its own besides the comparison helpers; run
// it with `go test ./core/pageserver/metamorphic/` (about a minute;
// STRATA_LONG_TESTS=1 runs a larger workload). It needs root (FUSE) and
// PostgreSQL 15, and skips otherwise.
package metamorphic

import (
	"bytes"
	"encoding/binary"

	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// PageKind guesses a page's resource manager from its layout: heap pages
// have no special space; btree, hash and GiST pages 16 bytes of it, the
// last uint16 a hash (0xFF80) or GiST (0xFF81) page id, or a btree cycle
// id (never above 0xFF7F, so that they differ); BRIN, SP-GiST, sequence and
// GIN pages 8: BRIN's last uint16 its page type (0xF091-0xF093), SP-GiST's
// its page id (0xFF82), a sequence's the zero high half of its magic
// (0x1717, the first uint32), GIN's its flags (a GIN page whose rightlink
// is block 0x1717 and whose flags are 0, an internal entry page, passes
// for a sequence page: their masks differ only in hint bits). It reports
// false for all-zero (new) pages and unknown layouts.
func PageKind(p []byte) (wal.RmgrID, bool) {
	if len(p) != pg.BlockSize || isNew(p) {
		return 0, false
	}
	last := binary.LittleEndian.Uint16(p[pg.BlockSize-2:])
	switch binary.LittleEndian.Uint16(p[16:]) { // pd_special
	case pg.BlockSize:
		return wal.RmHeap, true
	case pg.BlockSize - 16:
		switch {
		case last == 0xFF80:
			return wal.RmHash, true
		case last == 0xFF81:
			return wal.RmGist, true
		case last <= 0xFF7F:
			return wal.RmBtree, true
		}
	case pg.BlockSize - 8:
		switch {
		case last >= 0xF091 && last <= 0xF093:
			return wal.RmBRIN, true
		case last == 0xFF82:
			return wal.RmSPGist, true
		case last == 0 && binary.LittleEndian.Uint32(p[pg.BlockSize-8:]) == 0x1717:
			return wal.RmSequence, true
		}
		return wal.RmGin, true
	}
	return 0, false
}

// isNew reports an uninitialized page (pd_upper == 0), as PageIsNew does.
func isNew(p []byte) bool { return binary.LittleEndian.Uint16(p[14:]) == 0 }

// Equal reports whether two versions of a page of the given fork are the
// same once masked: heap, btree, hash, GiST, SP-GiST, GIN, BRIN and sequence pages with
// postgres.Mask (and an SP-GiST metapage but for its cache of last-used
// pages; GiST pages also by their NSN and follow-right flag, see
// gistLinksEqual); visibility-map pages but for their LSN and checksum;
// other pages whole.
// a and b are not modified.
func Equal(fork pg.ForkNumber, blk uint32, a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	if len(a) != len(b) || len(a) != pg.BlockSize {
		return false
	}
	a, b = bytes.Clone(a), bytes.Clone(b)
	if fork == pg.VMFork {
		clear(a[:10])
		clear(b[:10])
		return bytes.Equal(a, b)
	}
	ka, oka := PageKind(a)
	kb, okb := PageKind(b)
	if !oka || !okb || ka != kb {
		return false
	}
	if ka == wal.RmGist {
		if !gistLinksEqual(a, b) {
			return false
		}
		// F_TUPLES_DELETED: no Postgres code reads it. 15.18's VACUUM and
		// redo set it where tuples were deleted; 15.20's VACUUM leaves it
		// clear (seen on writeback pages), while the redo here does as
		// 15.18's. The harness ignores it too (Gist/DELETE).
		a[pg.BlockSize-4] &^= gistTuplesDeleted
		b[pg.BlockSize-4] &^= gistTuplesDeleted
	}
	postgres.Mask(ka, a, blk)
	postgres.Mask(kb, b, blk)
	if ka == wal.RmSPGist && blk == 0 {
		// SP-GiST's metapage caches the last pages used
		// (SpGistUpdateMetaPage), a hint never WAL-logged: redo leaves
		// it as the index build wrote it.
		clear(a[spgCacheStart:spgCacheEnd])
		clear(b[spgCacheStart:spgCacheEnd])
	}
	return bytes.Equal(a, b)
}

// gistLinksEqual compares what gist_mask hides but a GiST scan relies on:
// the NSN and the follow-right flag, which tell a scan whether to follow
// a page's rightlink too (a wrong NSN makes scans return tuples twice).
// Postgres masks them because a primary's consistency images are taken
// before they are known; writeback and redo pages both have them.
func gistLinksEqual(a, b []byte) bool {
	sa, sb := a[pg.BlockSize-16:], b[pg.BlockSize-16:]
	return bytes.Equal(sa[:8], sb[:8]) && sa[12]&gistFollowRight == sb[12]&gistFollowRight
}

// GiST page flags (the low byte of GISTPageOpaqueData's flags).
const (
	gistTuplesDeleted = 1 << 2
	gistFollowRight   = 1 << 3
)

// The lastUsedPages cache of an SP-GiST metapage: after the page header
// and the magic number, eight block numbers with their free space.
const (
	spgCacheStart = 24 + 4
	spgCacheEnd   = spgCacheStart + 8*8
)

// VMBitsSubset reports whether visibility-map page b has no bit that page
// a lacks, with the same header but for the LSN and checksum. Postgres
// WAL-logs the pages a CREATE DATABASE (WAL_LOG strategy) copies as
// standard-layout images, whose "hole" is the VM bitmap: any replay of
// that WAL, a standby's or strata's redo, gets those VM pages with the
// bits cleared. Fewer all-visible bits are safe (index-only scans visit
// the heap, VACUUM sets them again); more would not be.
func VMBitsSubset(a, b []byte) bool {
	if len(a) != pg.BlockSize || len(b) != pg.BlockSize || !bytes.Equal(a[10:24], b[10:24]) {
		return false
	}
	for i := 24; i < pg.BlockSize; i++ {
		if b[i]&^a[i] != 0 {
			return false
		}
	}
	return true
}
