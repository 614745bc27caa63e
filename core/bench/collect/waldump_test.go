package collect

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// TestRangeSegments: pg_waldump is told the file that holds the start, on
// the highest timeline, never a segment Postgres made ahead of need (zeros),
// whose header would give it no segment size; and the segment of the last
// byte before the end, on that timeline.
func TestRangeSegments(t *testing.T) {
	dir := t.TempDir()
	seg := func(name string, valid bool) {
		b := make([]byte, 8192)
		if valid {
			binary.LittleEndian.PutUint16(b[0:], 0xD110) // Postgres 15's xlp_magic
			binary.LittleEndian.PutUint16(b[2:], 0x0002) // XLP_LONG_HEADER
			binary.LittleEndian.PutUint32(b[32:], 16<<20)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Zeros first in any listing order that sorts by name.
	seg("000000010000000000000001", false)
	seg("000000010000000000000003", true)
	seg("000000020000000000000003", true)
	seg("000000030000000000000003", false) // made ahead of need on timeline 3
	seg("000000010000000000000004", true)
	if err := os.WriteFile(filepath.Join(dir, "000000010000000000000003.partial"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		start, end, first, last string
		ok                      bool
	}{
		{"0/3000028", "0/3000100", "000000020000000000000003", "000000020000000000000003", true},
		{"0/3000028", "0/4000000", "000000020000000000000003", "000000020000000000000003", true}, // end at a boundary
		{"0/3000028", "0/4000001", "000000020000000000000003", "000000020000000000000004", true},
		{"0/3000028", "0/6000100", "000000020000000000000003", "000000020000000000000006", true},
		{"0/4FFFFF0", "0/5000100", "000000010000000000000004", "000000010000000000000005", true},
		{"0/5000000", "0/5000100", "", "", false}, // no file holds the start
		{"0/3000100", "0/3000028", "", "", false}, // an empty range
		{"not an LSN", "0/3000100", "", "", false},
	} {
		first, last, ok := rangeSegments(dir, c.start, c.end)
		if first != c.first || last != c.last || ok != c.ok {
			t.Errorf("%s..%s: %q %q %v, want %q %q %v", c.start, c.end, first, last, ok, c.first, c.last, c.ok)
		}
	}
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, "000000010000000000000001"), make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if first, last, ok := rangeSegments(empty, "0/1000028", "0/1000100"); ok {
		t.Errorf("only zeros: %q %q", first, last)
	}
}
