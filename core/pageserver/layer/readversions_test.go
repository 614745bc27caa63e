package layer

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/pg"
)

// TestReadVersions checks that a read gets the versions from the newest
// base at or below its LSN on, from the in-memory layer and a layer file.
func TestReadVersions(t *testing.T) {
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 2, Block: 3})
	other := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 2, Block: 4})
	kinds := []Kind{Delta, Image, Delta, WillInit, Delta, Tombstone, Delta}
	var vs []Version
	for i, kind := range kinds {
		vs = append(vs, Version{Key: k, LSN: pg.LSN(10 * (i + 1)), Seq: uint64(i + 1), Kind: kind, Data: []byte{byte(i)}})
	}
	vs = append(vs, Version{Key: other, LSN: 15, Seq: 99, Kind: Image, Data: []byte{99}})
	cases := []struct {
		upto pg.LSN
		want []pg.LSN
	}{
		{5, nil},
		{10, []pg.LSN{10}},       // a lone delta: no base here
		{35, []pg.LSN{20, 30}},   // image at 20, then a delta
		{45, []pg.LSN{40}},       // will_init is a base
		{55, []pg.LSN{40, 50}},   //
		{65, []pg.LSN{60}},       // tombstone
		{1000, []pg.LSN{60, 70}}, //
	}
	m, err := OpenInMem(filepath.Join(t.TempDir(), "log"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.PutBatch(vs); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	w := NewWriter(&buf, DeltaLayer)
	for i := range vs[:len(kinds)] {
		if err := w.Add(&vs[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Add(&vs[len(kinds)]); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Finish(keyspace.Range{}, 0, 0); err != nil {
		t.Fatal(err)
	}
	r, err := Open(BytesSource(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		var got, gotFile []pg.LSN
		vs, err := m.ReadVersions(nil, k, c.upto)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vs {
			got = append(got, v.LSN)
		}
		for _, e := range r.ReadVersions(k, c.upto) {
			gotFile = append(gotFile, e.LSN)
		}
		if !equalLSNs(got, c.want) || !equalLSNs(gotFile, c.want) {
			t.Errorf("upto %d: in memory %v, file %v, want %v", c.upto, got, gotFile, c.want)
		}
	}
}

// TestRemovedInMem checks that a removed in-memory layer (its chunks
// recycled) refuses reads, and that data read before stays intact.
func TestRemovedInMem(t *testing.T) {
	k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 1, Rel: 2, Block: 3})
	m, err := OpenInMem(filepath.Join(t.TempDir(), "log"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	src := []byte("image")
	if err := m.PutBatch([]Version{{Key: k, LSN: 10, Seq: 1, Kind: Image, Data: src}}); err != nil {
		t.Fatal(err)
	}
	copy(src, "XXXXX") // the caller may reuse its buffer
	got, err := m.ReadVersions(nil, k, 100)
	if err != nil || len(got) != 1 || string(got[0].Data) != "image" {
		t.Fatalf("read %v, %v", got, err)
	}
	if err := m.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
	// Another layer reuses the chunk.
	m2, err := OpenInMem(filepath.Join(t.TempDir(), "log2"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if err := m2.PutBatch([]Version{{Key: k, LSN: 20, Seq: 2, Kind: Image, Data: []byte("other")}}); err != nil {
		t.Fatal(err)
	}
	if string(got[0].Data) != "image" {
		t.Fatalf("data read before Remove changed to %q", got[0].Data)
	}
	if _, err := m.ReadVersions(nil, k, 100); !errors.Is(err, ErrClosed) {
		t.Fatalf("read of a removed layer: %v", err)
	}
}

func equalLSNs(a, b []pg.LSN) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestTornBatch: a crash in the middle of a batch loses the whole batch
// (its marker is missing), not a part of it; the log is cut there and
// appends go on.
func TestTornBatch(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	m, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	batch := func(lsn pg.LSN, n int) []Version {
		var vs []Version
		for i := 0; i < n; i++ {
			vs = append(vs, Version{Key: keyspace.RelBlock(pg.PageKey{Spc: 1, DB: 2, Rel: 3, Block: uint32(i)}), LSN: lsn, Seq: uint64(lsn) + uint64(i), Kind: Image, Data: bytes.Repeat([]byte{byte(lsn)}, 100)})
		}
		return vs
	}
	if err := m.PutBatch(batch(10, 3)); err != nil {
		t.Fatal(err)
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(path)
	first := st.Size()
	if err := m.PutBatch(batch(20, 3)); err != nil {
		t.Fatal(err)
	}
	m.Close()
	// Cut the second batch after its first two versions (before its marker).
	rec := int64(logHeader + logFixed + 100)
	if err := os.Truncate(path, first+2*rec); err != nil {
		t.Fatal(err)
	}
	m2, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		k := keyspace.RelBlock(pg.PageKey{Spc: 1, DB: 2, Rel: 3, Block: uint32(i)})
		vs, err := m2.ReadVersions(nil, k, 1000)
		if err != nil || len(vs) != 1 || vs[0].LSN != 10 {
			t.Fatalf("block %d after the torn batch: %v %v", i, vs, err)
		}
	}
	if st, _ := os.Stat(path); st.Size() != first {
		t.Fatalf("log cut at %d bytes, want %d", st.Size(), first)
	}
	if err := m2.PutBatch(batch(30, 1)); err != nil {
		t.Fatal(err)
	}
	m2.Close()
	m3, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer m3.Close()
	k := keyspace.RelBlock(pg.PageKey{Spc: 1, DB: 2, Rel: 3, Block: 0})
	if vs, err := m3.ReadVersions(nil, k, 1000); err != nil || len(vs) != 1 || vs[0].LSN != 30 {
		t.Fatalf("append after the cut: %v %v", vs, err)
	}
}

// TestLegacyLogWithoutMarkers: a log written before batch markers replays
// every whole record.
func TestLegacyLogWithoutMarkers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "log")
	m, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	k := keyspace.RelBlock(pg.PageKey{Spc: 1, DB: 2, Rel: 3})
	for i := 0; i < 3; i++ {
		m.logMu.Lock()
		err := m.appendLog(&Version{Key: k, LSN: pg.LSN(10 * (i + 1)), Seq: uint64(i + 1), Kind: Delta, Data: []byte{byte(i)}})
		m.logMu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	m.Close()
	m2, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if vs := m2.Versions(nil, k, 1000); len(vs) != 3 {
		t.Fatalf("replayed %d versions of a legacy log, want 3", len(vs))
	}
}
