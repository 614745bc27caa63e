package layer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

func randVersions(rng *rand.Rand, n int) []Version {
	var vs []Version
	for i := 0; i < n; i++ {
		k := keyspace.RelBlock(pg.PageKey{Spc: 1663, DB: 5, Rel: uint32(rng.Intn(4)), Block: uint32(rng.Intn(50))})
		d := make([]byte, rng.Intn(300))
		rng.Read(d)
		vs = append(vs, Version{Key: k, LSN: pg.LSN(rng.Intn(1000) + 1), Seq: uint64(i + 1), Kind: Kind(1 + rng.Intn(4)), Data: d})
	}
	sort.Slice(vs, func(i, j int) bool { return vs[i].Before(&vs[j]) })
	return vs
}

func TestWriterReaderRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	vs := randVersions(rng, 2000)
	var buf bytes.Buffer
	w := NewWriter(&buf, DeltaLayer)
	for i := range vs {
		if err := w.Add(&vs[i]); err != nil {
			t.Fatal(err)
		}
	}
	d, err := w.Finish(keyspace.Range{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Size != int64(buf.Len()) || d.Count != int64(len(vs)) {
		t.Fatalf("desc %+v, file %d bytes", d, buf.Len())
	}
	r, err := Open(BytesSource(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Desc(); got.Keys != d.Keys || got.LSNStart != d.LSNStart || got.LSNEnd != d.LSNEnd || got.MaxSeq != d.MaxSeq {
		t.Fatalf("footer %+v want %+v", got, d)
	}
	for i := 0; i < r.Len(); i++ {
		v, err := r.Version(r.Entry(i))
		if err != nil {
			t.Fatal(err)
		}
		if v.Key != vs[i].Key || v.LSN != vs[i].LSN || v.Seq != vs[i].Seq || v.Kind != vs[i].Kind || !bytes.Equal(v.Data, vs[i].Data) {
			t.Fatalf("entry %d differs", i)
		}
	}
	// Versions(k, upto) returns exactly the model's versions.
	k := vs[len(vs)/2].Key
	var want []Version
	for _, v := range vs {
		if v.Key == k && v.LSN <= 500 {
			want = append(want, v)
		}
	}
	got := r.Versions(k, 500)
	if len(got) != len(want) {
		t.Fatalf("Versions: %d want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].LSN != want[i].LSN || got[i].Seq != want[i].Seq {
			t.Fatalf("Versions[%d]", i)
		}
	}
	// Out of order Add is refused.
	if err := NewWriter(&bytes.Buffer{}, DeltaLayer).Add(&vs[1]); err != nil {
		t.Fatal(err)
	}
	w2 := NewWriter(&bytes.Buffer{}, DeltaLayer)
	_ = w2.Add(&vs[1])
	if err := w2.Add(&vs[0]); !errors.Is(err, ErrOrder) {
		t.Fatalf("out of order Add: %v", err)
	}
}

func TestReaderDetectsCorruption(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	vs := randVersions(rng, 50)
	var buf bytes.Buffer
	w := NewWriter(&buf, ImageLayer)
	for i := range vs {
		_ = w.Add(&vs[i])
	}
	if _, err := w.Finish(keyspace.Range{}, 0, 0); err != nil {
		t.Fatal(err)
	}
	file := buf.Bytes()
	for _, off := range []int{len(file) - 3, len(file) - footerSize - 5} { // footer, index
		bad := bytes.Clone(file)
		bad[off] ^= 0x40
		if _, err := Open(BytesSource(bad)); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("flip at %d: %v", off, err)
		}
	}
	// A flipped value byte is caught on Read.
	bad := bytes.Clone(file)
	r, _ := Open(BytesSource(bad))
	var e Entry
	for i := 0; i < r.Len(); i++ {
		if e = r.Entry(i); e.len > 0 {
			break
		}
	}
	bad[e.off] ^= 1
	if _, err := r.Read(e); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("value flip: %v", err)
	}
	if _, err := Open(BytesSource(file[:10])); !errors.Is(err, ErrCorrupt) {
		t.Fatal("short file accepted")
	}
}

func TestRemoteSourceRangedReads(t *testing.T) {
	rng := rand.New(rand.NewSource(4))
	vs := randVersions(rng, 300)
	var buf bytes.Buffer
	w := NewWriter(&buf, DeltaLayer)
	for i := range vs {
		_ = w.Add(&vs[i])
	}
	_, _ = w.Finish(keyspace.Range{}, 0, 0)
	st := objectstore.NewMemory()
	ctx := context.Background()
	if err := st.Put(ctx, "l", bytes.NewReader(buf.Bytes()), objectstore.PutOptions{Size: int64(buf.Len())}); err != nil {
		t.Fatal(err)
	}
	r, err := Open(&RemoteSource{Ctx: ctx, Store: st, Key: "l", Len: int64(buf.Len())})
	if err != nil {
		t.Fatal(err)
	}
	v, err := r.Version(r.Entry(r.Len() - 1))
	if err != nil || !bytes.Equal(v.Data, vs[len(vs)-1].Data) {
		t.Fatalf("remote read: %v", err)
	}
}

func TestInMemReplayAndTornTail(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "open.log")
	m, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewSource(5))
	vs := randVersions(rng, 200)
	rng.Shuffle(len(vs), func(i, j int) { vs[i], vs[j] = vs[j], vs[i] })
	for _, v := range vs {
		if err := m.Put(v); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Sync(); err != nil {
		t.Fatal(err)
	}
	want := m.Sorted()
	m.Close()
	// Tear the tail: append half a record.
	f, _ := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	f.Write([]byte{0, 0, 1, 0, 9, 9})
	f.Close()
	m2, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := m2.Sorted()
	if len(got) != len(want) {
		t.Fatalf("replayed %d versions, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i].Key != want[i].Key || got[i].Seq != want[i].Seq || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Fatalf("replay differs at %d", i)
		}
	}
	// After the torn tail was cut, appends are readable again.
	extra := Version{Key: keyspace.FileMeta("x"), LSN: 5, Seq: 9999, Kind: Image, Data: []byte("hi")}
	if err := m2.Put(extra); err != nil {
		t.Fatal(err)
	}
	m2.Close()
	m3, err := OpenInMem(path, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if got := m3.Versions(nil, extra.Key, 100); len(got) != 1 || string(got[0].Data) != "hi" {
		t.Fatalf("append after torn tail lost: %v", got)
	}
	// Freeze, write to files, read back.
	if err := m3.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := m3.Put(extra); !errors.Is(err, ErrFrozen) {
		t.Fatal("put on frozen layer")
	}
	all := m3.Sorted()
	descs, err := WriteFiles(dir, DeltaLayer, all, 8<<10, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(descs) < 3 {
		t.Fatalf("expected several files at an 8 KiB target, got %d", len(descs))
	}
	n := 0
	for i, d := range descs {
		if i > 0 && descs[i-1].Keys.Overlaps(d.Keys) {
			t.Fatal("flushed files overlap in keys")
		}
		src, err := os.ReadFile(filepath.Join(dir, d.Name))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Open(BytesSource(src))
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < r.Len(); j++ {
			v, err := r.Version(r.Entry(j))
			if err != nil || v.Seq != all[n].Seq || !bytes.Equal(v.Data, all[n].Data) {
				t.Fatal(fmt.Sprint("file content differs ", err))
			}
			n++
		}
	}
	if n != len(all) {
		t.Fatalf("files hold %d versions, want %d", n, len(all))
	}
	if err := m3.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatal("log not removed")
	}
}
