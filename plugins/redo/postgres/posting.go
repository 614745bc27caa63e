package postgres

import (
	"encoding/binary"
	"fmt"
)

// Posting-list tuples (nbtree.h): INDEX_ALT_TID_MASK in t_info, and t_tid
// holding the offset of the heap TID array (block field) and the count
// with BT_IS_POSTING (offset field).
const (
	btIsPosting  = 0x2000
	btOffsetMask = 0x0FFF
	tidSize      = 6
	btMaxItemSz  = 2712 // BTMaxItemSize for 8 KiB pages
)

func tidOffset(t []byte) uint16 { return binary.LittleEndian.Uint16(t[4:]) }

func isPosting(t []byte) bool {
	return binary.LittleEndian.Uint16(t[6:])&indexAltTIDMask != 0 && tidOffset(t)&btIsPosting != 0
}

func nPosting(t []byte) int      { return int(tidOffset(t) & btOffsetMask) }
func postingOffset(t []byte) int { return int(downlink(t)) }

func setIndexSize(t []byte, n int) {
	ti := binary.LittleEndian.Uint16(t[6:])
	binary.LittleEndian.PutUint16(t[6:], ti&^indexSizeMask|uint16(n))
}

func setPosting(t []byte, n, off int) {
	binary.LittleEndian.PutUint16(t[6:], binary.LittleEndian.Uint16(t[6:])|indexAltTIDMask)
	binary.LittleEndian.PutUint16(t[4:], uint16(n)|btIsPosting)
	setDownlink(t, uint32(off))
}

// formPosting is _bt_form_posting: a tuple with base's key and htids.
func formPosting(base []byte, htids []byte) []byte {
	keysize := indexTupleSize(base)
	if isPosting(base) {
		keysize = postingOffset(base)
	}
	n := len(htids) / tidSize
	newsize := keysize
	if n > 1 {
		newsize = maxAlign(keysize + len(htids))
	}
	t := make([]byte, newsize)
	copy(t, base[:keysize])
	setIndexSize(t, newsize)
	if n > 1 {
		setPosting(t, n, keysize)
		copy(t[keysize:], htids)
	} else {
		binary.LittleEndian.PutUint16(t[6:], binary.LittleEndian.Uint16(t[6:])&^indexAltTIDMask)
		copy(t[:tidSize], htids)
	}
	return t
}

// heapTIDs returns the heap TIDs of a leaf tuple.
func heapTIDs(t []byte) ([]byte, error) {
	if !isPosting(t) {
		return t[:tidSize], nil
	}
	o, n := postingOffset(t), nPosting(t)
	if o+n*tidSize > len(t) {
		return nil, fmt.Errorf("%w: posting list beyond its tuple", errPage)
	}
	return t[o : o+n*tidSize], nil
}

// swapPosting is _bt_swap_posting: newItem's TID goes into a copy of the
// posting list at postingOff, and newItem takes the list's last TID.
func swapPosting(newItem, oposting []byte, postingOff int) ([]byte, error) {
	n := nPosting(oposting)
	if !isPosting(oposting) || postingOff <= 0 || postingOff >= n {
		return nil, fmt.Errorf("%w: posting split at %d of %d", errRecord, postingOff, n)
	}
	np := append([]byte(nil), oposting[:indexTupleSize(oposting)]...)
	base := postingOffset(np)
	if base+n*tidSize > len(np) {
		return nil, errShort
	}
	at := base + postingOff*tidSize
	copy(np[at+tidSize:base+n*tidSize], np[at:base+(n-1)*tidSize])
	copy(np[at:at+tidSize], newItem[:tidSize])
	last := oposting[base+(n-1)*tidSize : base+n*tidSize]
	copy(newItem[:tidSize], last)
	return np, nil
}

// redoDedup is btree_xlog_dedup.
func redoDedup(nintervals int, intervals []byte, p page) error {
	if len(intervals) < 4*nintervals {
		return errShort
	}
	o := p.bt()
	minOff := 2
	if o.next() == 0 {
		minOff = 1
	}
	maxOff := p.maxOff()
	np := make(page, len(p))
	np.init(len(p) - p.special())
	copy(np[np.special():], p[p.special():])
	if o.next() != 0 {
		hk, err := p.item(1)
		if err != nil {
			return err
		}
		if err := np.addItem(hk, 1, false, false); err != nil {
			return err
		}
	}
	var (
		base      []byte
		baseOff   int
		baseSize  int
		htids     []byte
		nitems    int
		nInterval int
	)
	start := func(t []byte, off int) error {
		h, err := heapTIDs(t)
		if err != nil {
			return err
		}
		htids = append(htids[:0], h...)
		baseSize = indexTupleSize(t)
		if isPosting(t) {
			baseSize = postingOffset(t)
		}
		base, baseOff, nitems = t, off, 1
		return nil
	}
	finish := func() error {
		off := np.maxOff() + 1
		if nitems == 1 {
			sz := indexTupleSize(base)
			if sz > len(base) {
				return fmt.Errorf("%w: index tuple size %d beyond item", errPage, sz)
			}
			return np.addItem(base[:sz], off, false, false)
		}
		final := formPosting(base, htids)
		nInterval++
		return np.addItem(final, off, false, false)
	}
	for off := minOff; off <= maxOff; off++ {
		t, err := p.item(off)
		if err != nil {
			return err
		}
		if len(t) < 8 {
			return fmt.Errorf("%w: index tuple of %d bytes", errPage, len(t))
		}
		if off == minOff {
			if err := start(t, off); err != nil {
				return err
			}
			continue
		}
		if nInterval < nintervals &&
			baseOff == int(binary.LittleEndian.Uint16(intervals[4*nInterval:])) &&
			nitems < int(binary.LittleEndian.Uint16(intervals[4*nInterval+2:])) {
			h, err := heapTIDs(t)
			if err != nil {
				return err
			}
			if maxAlign(baseSize+len(htids)+len(h)) > btMaxItemSz {
				return fmt.Errorf("%w: deduplication overflows a posting list", errRecord)
			}
			htids = append(htids, h...)
			nitems++
			continue
		}
		if err := finish(); err != nil {
			return err
		}
		if err := start(t, off); err != nil {
			return err
		}
	}
	if base != nil {
		if err := finish(); err != nil {
			return err
		}
	}
	no := np.bt()
	no.setFlags(no.flags() &^ btpHasGarbage)
	copy(p, np)
	return nil
}

// applyPostingUpdates is btree_xlog_updates: remove some TIDs from posting
// lists. d holds the updated offsets and then the xl_btree_update entries.
func applyPostingUpdates(p page, d []byte, nupdated int) error {
	if len(d) < 2*nupdated {
		return errShort
	}
	offs := offsets(d[:2*nupdated])
	u := d[2*nupdated:]
	for _, off := range offs {
		if len(u) < 2 {
			return errShort
		}
		ndel := int(binary.LittleEndian.Uint16(u))
		if len(u) < 2+2*ndel {
			return errShort
		}
		del := offsets(u[2 : 2+2*ndel])
		u = u[2+2*ndel:]
		orig, err := p.item(off)
		if err != nil {
			return err
		}
		if !isPosting(orig) {
			return fmt.Errorf("%w: update of a non-posting tuple at %d", errRecord, off)
		}
		n := nPosting(orig) - ndel
		keysize := postingOffset(orig)
		h, err := heapTIDs(orig)
		if err != nil {
			return err
		}
		var keep []byte
		di := 0
		for i := 0; i < nPosting(orig); i++ {
			if di < len(del) && del[di] == i {
				di++
				continue
			}
			keep = append(keep, h[i*tidSize:(i+1)*tidSize]...)
		}
		if len(keep) != n*tidSize || n < 1 {
			return fmt.Errorf("%w: posting update leaves %d TIDs", errRecord, len(keep)/tidSize)
		}
		base := append([]byte(nil), orig[:keysize]...)
		// formPosting reads the key size from the original posting header.
		setPosting(base, nPosting(orig), keysize)
		t := formPosting(base, keep)
		for len(t)%8 != 0 {
			t = append(t, 0)
		}
		if err := p.indexTupleOverwrite(off, t); err != nil {
			return err
		}
	}
	return nil
}
