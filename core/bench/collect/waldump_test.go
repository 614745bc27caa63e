package collect

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// TestStartSegment: pg_waldump is told the file that holds the start, on
// the highest timeline, never a segment Postgres made ahead of need (zeros),
// whose header would give it no segment size.
func TestStartSegment(t *testing.T) {
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
	if got, ok := startSegment(dir, "0/3000028"); !ok || got != "000000020000000000000003" {
		t.Errorf("start 0/3000028: %q %v, want timeline 2's segment 3", got, ok)
	}
	if got, ok := startSegment(dir, "0/4FFFFF0"); !ok || got != "000000010000000000000004" {
		t.Errorf("start 0/4FFFFF0: %q %v", got, ok)
	}
	if got, ok := startSegment(dir, "0/5000000"); ok {
		t.Errorf("start 0/5000000 (no file holds it): %q", got)
	}
	if got, ok := startSegment(dir, "not an LSN"); ok {
		t.Errorf("a bad LSN: %q", got)
	}
	empty := t.TempDir()
	seg2 := filepath.Join(empty, "000000010000000000000001")
	if err := os.WriteFile(seg2, make([]byte, 8192), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, ok := startSegment(empty, "0/1000028"); ok {
		t.Errorf("only zeros: %q", got)
	}
}
