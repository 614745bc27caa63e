package walpos

import (
	"errors"
	"sync"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

const seg16 = 16 << 20

func TestParseSegmentName(t *testing.T) {
	for _, tc := range []struct {
		name    string
		segSize uint64
		tli     pg.PGTimeline
		segNo   uint64
	}{
		{"000000010000000000000001", seg16, 1, 1},
		{"0000000100000000000000FF", seg16, 1, 255},
		{"000000020000000100000000", seg16, 2, 256},
		{"00000003000000160000004B", seg16, 3, 0x16*256 + 0x4B},
		{"000000010000000100000003", 1 << 30, 1, 4 + 3},
	} {
		got, err := ParseSegmentName(tc.name, tc.segSize)
		if err != nil || got.Timeline != tc.tli || got.SegNo != tc.segNo {
			t.Errorf("ParseSegmentName(%q) = %+v, %v; want tli %d seg %d", tc.name, got, err, tc.tli, tc.segNo)
		}
		if f := FormatSegmentName(tc.tli, tc.segNo, tc.segSize); f != tc.name {
			t.Errorf("FormatSegmentName = %q; want %q", f, tc.name)
		}
	}
	for _, bad := range []string{
		"", "00000001000000000000001", "0000000100000000000000010", "00000001000000000000000g",
		"000000010000000000000100", // segment part 0x100 is too large for 16 MiB segments
		"xlogtemp.1234", "00000002.history", "000000010000000000000001.partial",
		"0000000100000000000000ff", // Postgres writes upper case only
	} {
		if _, err := ParseSegmentName(bad, seg16); !errors.Is(err, ErrNotSegment) {
			t.Errorf("ParseSegmentName(%q) err = %v; want ErrNotSegment", bad, err)
		}
	}
}

func TestPositionMatchesPostgresLSN(t *testing.T) {
	// Postgres names the segment holding 16/B374D848 (16 MiB segments) as
	// 0000000100000016000000B3; the byte at offset 0x74D848 is that LSN.
	lsn, _ := pg.ParseLSN("16/B374D848")
	name := FormatSegmentName(1, lsn.Segment(seg16), seg16)
	if name != "0000000100000016000000B3" {
		t.Fatalf("name = %s", name)
	}
	got, ok := Position(name, int64(lsn.SegmentOffset(seg16)), 8192, seg16)
	if !ok || got != lsn+8192 {
		t.Fatalf("Position = %v, %v; want %v", got, ok, lsn+8192)
	}
	if _, ok := Position(name, seg16-100, 200, seg16); ok {
		t.Fatal("write past the segment end accepted")
	}
	if _, ok := Position(name, 0, 0, seg16); ok {
		t.Fatal("empty write accepted")
	}
}

func TestTrackerMonotonic(t *testing.T) {
	tr := New(seg16, 0x5000)
	if tr.Current() != 0x5000 {
		t.Fatalf("start = %v", tr.Current())
	}
	if _, ok := tr.Wrote("xlogtemp.77", 0, 8192); ok || tr.Current() != 0x5000 {
		t.Fatalf("temp file moved W to %v", tr.Current())
	}
	if _, ok := tr.Wrote("000000010000000000000002", 8192, 8192); !ok {
		t.Fatal("segment write ignored")
	}
	want := pg.LSN(2*seg16 + 16384)
	if tr.Current() != want {
		t.Fatalf("W = %v; want %v", tr.Current(), want)
	}
	// A rewrite of an earlier page (Postgres rewrites the partial last page)
	// never moves W back.
	tr.Wrote("000000010000000000000002", 0, 8192)
	tr.Wrote("000000010000000000000001", 0, 8192)
	if tr.Current() != want {
		t.Fatalf("W moved back to %v", tr.Current())
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 1000; j++ {
				tr.Wrote("000000010000000000000003", int64(j*8192+i), 1)
			}
		}(i)
	}
	wg.Wait()
	if want := pg.LSN(3*seg16 + 999*8192 + 7 + 1); tr.Current() != want {
		t.Fatalf("concurrent W = %v; want %v", tr.Current(), want)
	}
}
