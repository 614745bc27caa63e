package storetest

import (
	"bytes"
	"io"
	"testing"
)

func TestPatternAddressable(t *testing.T) {
	p := Pattern{Seed: 42}
	all := make([]byte, 10000)
	if _, err := io.ReadFull(p.Reader(10000), all); err != nil {
		t.Fatal(err)
	}
	for _, r := range [][2]int64{{0, 1}, {3, 17}, {8, 8}, {9999, 1}, {1234, 5000}} {
		if got := p.Bytes(r[0], r[1]); !bytes.Equal(got, all[r[0]:r[0]+r[1]]) {
			t.Fatalf("Bytes(%d, %d) differs from the stream", r[0], r[1])
		}
	}
	if bytes.Equal(Pattern{Seed: 1}.Bytes(0, 64), Pattern{Seed: 2}.Bytes(0, 64)) {
		t.Fatal("different seeds give the same bytes")
	}
}

func BenchmarkPattern(b *testing.B) {
	buf := make([]byte, 1<<20)
	b.SetBytes(int64(len(buf)))
	for i := 0; i < b.N; i++ {
		Pattern{Seed: 1}.Fill(int64(i)<<20, buf)
	}
}
