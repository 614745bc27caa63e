package postgres

import (
	"bytes"
	"errors"
	"testing"
)

func tids(keys ...uint64) []byte {
	out := make([]byte, len(keys)*tidSize)
	for i, k := range keys {
		putTidKey(out[i*tidSize:], k)
	}
	return out
}

// TestGinPostingListCodec: a segment decodes to the items it was encoded
// from, with deltas of one to seven varbyte bytes (the seventh byte has no
// continuation bit); the bytes are those of ginCompressPostingList (an odd
// length padded with a zero byte), and a truncated segment is an error.
func TestGinPostingListCodec(t *testing.T) {
	const far = 1<<42 + 1<<28 + 5 // the largest key is below 1<<43 (32-bit block, 11-bit offset)
	items := tids(1<<11|1, 1<<11|2, 5<<11|7, 1<<20, 1<<28|3, far, far+1, far+2)
	seg, err := ginEncodeSegment(items)
	if err != nil {
		t.Fatal(err)
	}
	// The first item, then deltas of 1, 2, 3, 4 and 7 bytes and two of 1.
	if n := int(seg[6]) | int(seg[7])<<8; n != 1+2+3+4+7+1+1 || len(seg) != 8+n+1 || seg[len(seg)-1] != 0 {
		t.Fatalf("segment of %d bytes, nbytes %d: % x", len(seg), n, seg)
	}
	if !bytes.Equal(seg[8:11], []byte{0x01, 0x85, 0x40}) {
		t.Fatalf("deltas begin % x, want 01 85 40", seg[8:11])
	}
	got, err := ginDecodeSegment(seg)
	if err != nil || !bytes.Equal(got, items) {
		t.Fatalf("decoded % x (%v), want % x", got, err, items)
	}
	if n, err := ginSegmentSize(seg); err != nil || n != len(seg) {
		t.Fatalf("segment size %d (%v), want %d", n, err, len(seg))
	}
	if _, err := ginSegmentSize(seg[:len(seg)-2]); !errors.Is(err, errRecord) {
		t.Fatalf("truncated segment: %v, want a malformed-record error", err)
	}
	bad := append([]byte(nil), seg...)
	bad[len(bad)-2] |= 0x80 // the last delta continues past the segment
	if _, err := ginDecodeSegment(bad); !errors.Is(err, errRecord) {
		t.Fatalf("varbyte past the segment: %v, want a malformed-record error", err)
	}
	if _, err := ginEncodeSegment(tids(5, 5)); !errors.Is(err, errRecord) {
		t.Fatalf("items out of order: %v, want an error", err)
	}
	if m := ginMergeItems(tids(1, 3, 5), tids(2, 3, 6)); !bytes.Equal(m, tids(1, 2, 3, 5, 6)) {
		t.Fatalf("merged % x", m)
	}
}
