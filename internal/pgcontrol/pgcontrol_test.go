package pgcontrol

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

// control returns a minimal pg_control: version 1300 and a valid CRC.
func control() []byte {
	b := make([]byte, 8192)
	binary.LittleEndian.PutUint64(b[SystemIDOffset:], 7)
	binary.LittleEndian.PutUint32(b[8:], Version)
	binary.LittleEndian.PutUint32(b[CRCOffset:], crc32.Checksum(b[:CRCOffset], castagnoli))
	return b
}

// TestRewrite: a rewrite changes the field, keeps the input as it was and
// leaves a pg_control that checks; a bad CRC, version or size is refused.
func TestRewrite(t *testing.T) {
	in := control()
	out, err := Rewrite(in, func(b []byte) { binary.LittleEndian.PutUint64(b[SystemIDOffset:], 42) })
	if err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(out); got != 42 || binary.LittleEndian.Uint64(in) != 7 {
		t.Fatalf("system identifier %d in the copy, %d in the input; want 42 and 7", got, binary.LittleEndian.Uint64(in))
	}
	if err := Check(out); err != nil {
		t.Fatalf("the rewritten pg_control: %v", err)
	}
	bad := control()
	bad[100] ^= 1
	if err := Check(bad); !errors.Is(err, ErrBad) {
		t.Fatalf("a changed byte under the CRC: %v", err)
	}
	old := control()
	binary.LittleEndian.PutUint32(old[8:], 1201)
	if _, err := Rewrite(old, func([]byte) {}); !errors.Is(err, ErrBad) {
		t.Fatalf("PostgreSQL 14's version: %v", err)
	}
	if err := Check(make([]byte, 100)); !errors.Is(err, ErrBad) {
		t.Fatalf("100 bytes: %v", err)
	}
}
