package keyspace

import (
	"bytes"
	"math/rand"
	"sort"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

func TestRelKeysRoundTripAndOrder(t *testing.T) {
	r := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.VMFork}
	k := RelBlock(r.Page(7))
	if k.PageKey() != r.Page(7) || !k.IsRelBlock() || k.IsRelSize() {
		t.Fatalf("round trip: %v", k.PageKey())
	}
	sz := RelSize(r)
	if !sz.IsRelSize() || sz.Rel() != r {
		t.Fatalf("size key: %v", sz)
	}
	// The size key sorts after every block of the relation and before the next fork.
	if !RelBlock(r.Page(0xFFFFFFFE)).Less(sz) {
		t.Fatal("size key must follow the last block")
	}
	next := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.InitFork}
	if !sz.Less(RelBlock(next.Page(0))) {
		t.Fatal("size key must precede the next fork")
	}
	rr := RelRange(r)
	if !rr.Contains(k) || !rr.Contains(sz) || rr.Contains(RelBlock(next.Page(0))) {
		t.Fatal("RelRange")
	}
	if !DBRange(1663, 5).Covers(rr) || DBRange(1663, 6).Overlaps(rr) {
		t.Fatal("DBRange")
	}
	if !RelsRange.Contains(sz) || RelsRange.Contains(FileMeta("pg_control")) {
		t.Fatal("RelsRange")
	}
}

func TestKeyOrderMatchesFields(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	var pks []pg.PageKey
	for i := 0; i < 500; i++ {
		pks = append(pks, pg.PageKey{Spc: uint32(rng.Intn(3)), DB: uint32(rng.Intn(3)), Rel: uint32(rng.Intn(1 << 20)), Fork: pg.ForkNumber(rng.Intn(4)), Block: rng.Uint32()})
	}
	keys := make([]Key, len(pks))
	for i, p := range pks {
		keys[i] = RelBlock(p)
	}
	sort.Slice(pks, func(i, j int) bool {
		a, b := pks[i], pks[j]
		if a.Spc != b.Spc {
			return a.Spc < b.Spc
		}
		if a.DB != b.DB {
			return a.DB < b.DB
		}
		if a.Rel != b.Rel {
			return a.Rel < b.Rel
		}
		if a.Fork != b.Fork {
			return a.Fork < b.Fork
		}
		return a.Block < b.Block
	})
	sort.Slice(keys, func(i, j int) bool { return keys[i].Less(keys[j]) })
	for i := range keys {
		if keys[i].PageKey() != pks[i] {
			t.Fatalf("order differs at %d: %v vs %v", i, keys[i].PageKey(), pks[i])
		}
	}
}

func TestFileKeys(t *testing.T) {
	k := FileBlock("pg_xact/0001", 3)
	if k.Namespace() != NSSLRU || k.Block() != 3 || k != SLRUBlock(SLRUXact, 1, 3) {
		t.Fatalf("slru key %v", k)
	}
	if kind, seg, ok := ParseSLRUPath("pg_multixact/members/00A1"); !ok || kind != SLRUMultiXactMember || seg != 0xA1 {
		t.Fatal("ParseSLRUPath members")
	}
	for _, p := range []string{"pg_xact/zz01", "pg_xact/01", "global/pg_control", "pg_xact/00a1"} {
		if _, _, ok := ParseSLRUPath(p); ok {
			t.Fatalf("%q parsed as SLRU", p)
		}
	}
	a, b := FileMeta("global/pg_control"), FileMeta("global/pg_filenode.map")
	if a == b || a.Namespace() != NSFile || !a.IsMeta() || FileBlock("global/pg_control", 0).IsMeta() {
		t.Fatal("file keys")
	}
	if !FilesRange.Contains(a) || !FilesRange.Contains(k) || FilesRange.Contains(RelSize(pg.RelTag{})) {
		t.Fatal("FilesRange")
	}
}

func TestNextAndParse(t *testing.T) {
	k := Key{0, 0, 0xFF}
	k[KeySize-1] = 0xFF
	n := k.Next()
	if !k.Less(n) || n[KeySize-1] != 0 || n[KeySize-2] != 1 {
		t.Fatalf("Next: %v", n)
	}
	if MaxKey.Next() != MaxKey {
		t.Fatal("MaxKey.Next")
	}
	p, err := ParseKey(k.String())
	if err != nil || p != k {
		t.Fatal("ParseKey")
	}
	if _, err := ParseKey("zz"); err == nil {
		t.Fatal("ParseKey accepted junk")
	}
	if (Range{Start: n, End: k}).IsEmpty() != true {
		t.Fatal("IsEmpty")
	}
}

// TestCompareIsByteOrder: Compare (three big-endian words) orders keys as
// their bytes do, for random keys and for keys that differ in one byte
// only, in each word and at the word boundaries.
func TestCompareIsByteOrder(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	random := func() Key {
		var k Key
		for i := range k {
			k[i] = byte(rng.Intn(4)) * 85 // few values: many equal prefixes
		}
		return k
	}
	check := func(a, b Key) {
		t.Helper()
		if got, want := a.Compare(b), bytes.Compare(a[:], b[:]); got != want {
			t.Fatalf("Compare(%x, %x) = %d, want %d", a, b, got, want)
		}
		if a.Less(b) != (bytes.Compare(a[:], b[:]) < 0) {
			t.Fatalf("Less(%x, %x) = %v", a, b, a.Less(b))
		}
	}
	for i := 0; i < 100000; i++ {
		check(random(), random())
	}
	for i := 0; i < KeySize; i++ {
		a := random()
		b := a
		check(a, b)
		b[i] ^= 0x80
		check(a, b)
		check(b, a)
	}
}

func BenchmarkRangeContains(b *testing.B) {
	r := Range{Start: RelBlock(pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}.Page(0)), End: RelBlock(pg.RelTag{Spc: 1663, DB: 5, Rel: 16390}.Page(0))}
	k := RelBlock(pg.RelTag{Spc: 1663, DB: 5, Rel: 16385}.Page(77))
	n := 0
	for b.Loop() {
		if r.Contains(k) {
			n++
		}
	}
	if n == 0 {
		b.Fatal("key not in range")
	}
}
