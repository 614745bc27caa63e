package pg

import (
	"errors"
	"testing"
)

func TestLSNRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		s string
		v LSN
	}{
		{"0/0", 0},
		{"16/B374D848", 0x16B374D848},
		{"FFFFFFFF/FFFFFFFF", ^LSN(0)},
		{"0/1000000", 0x1000000},
	} {
		got, err := ParseLSN(tc.s)
		if err != nil || got != tc.v {
			t.Fatalf("ParseLSN(%q) = %v, %v; want %v", tc.s, got, err, tc.v)
		}
		if got.String() != tc.s {
			t.Fatalf("String() = %q; want %q", got.String(), tc.s)
		}
	}
	if got, _ := ParseLSN("16/b374d848"); got != 0x16B374D848 {
		t.Fatalf("lower case: %v", got)
	}
}

func TestLSNParseErrors(t *testing.T) {
	for _, s := range []string{"", "16", "/1", "1/", "G/1", "1/100000000", "1//2"} {
		if _, err := ParseLSN(s); !errors.Is(err, ErrBadLSN) {
			t.Errorf("ParseLSN(%q) err = %v; want ErrBadLSN", s, err)
		}
	}
}

func TestLSNSegment(t *testing.T) {
	l := LSN(3*WALSegmentSize + 42)
	if l.Segment(WALSegmentSize) != 3 || l.SegmentOffset(WALSegmentSize) != 42 {
		t.Fatalf("segment math wrong for %v", l)
	}
}

func TestTimelineID(t *testing.T) {
	id := TimelineID{0xde, 0xad, 0xbe, 0xef, 15: 1}
	back, err := ParseTimelineID(id.String())
	if err != nil || back != id {
		t.Fatalf("round trip: %v %v", back, err)
	}
	if _, err := ParseTimelineID("xyz"); err == nil {
		t.Fatal("want error")
	}
}

func TestPageKeyString(t *testing.T) {
	k := RelTag{1663, 5, 16384, VMFork}.Page(7)
	if got := k.String(); got != "1663/5/16384_vm blk 7" {
		t.Fatalf("got %q", got)
	}
}
