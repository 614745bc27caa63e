package prewarm

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/pg"
)

func sampleKeys() []pg.PageKey {
	a := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	b := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.VMFork}
	c := pg.RelTag{Spc: 1664, DB: 0, Rel: 1262}
	var keys []pg.PageKey
	for blk := uint32(0); blk < 1000; blk++ {
		keys = append(keys, a.Page(blk))
	}
	keys = append(keys, b.Page(0), c.Page(7), c.Page(9), a.Page(5000), a.Page(0)) // a duplicate
	return keys
}

func TestEncodeDecode(t *testing.T) {
	keys := sampleKeys()
	data := Encode(keys)
	// 1,000 consecutive blocks are one run: 5 runs in all.
	if want := len(magic) + 8 + 5*runSize + 4; len(data) != want {
		t.Errorf("encoded %d keys in %d bytes, want %d (one run per range)", len(keys), len(data), want)
	}
	got, err := Decode(data)
	if err != nil {
		t.Fatal(err)
	}
	want := slices.Clone(keys)
	slices.SortFunc(want, comparePageKeys)
	want = slices.Compact(want)
	if !slices.Equal(got, want) {
		t.Fatalf("decoded %d keys, want %d: %v", len(got), len(want), got[len(got)-4:])
	}
	if got, err := Decode(Encode(nil)); err != nil || len(got) != 0 {
		t.Errorf("empty list: %v, %v", got, err)
	}
}

// TestDecodeRefusesDamage: every single-byte change and every truncation
// of a list is refused with ErrCorrupt, never decoded into other pages.
func TestDecodeRefusesDamage(t *testing.T) {
	data := Encode(sampleKeys())
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x20
		if _, err := Decode(bad); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("byte %d flipped: err = %v, want ErrCorrupt", i, err)
		}
	}
	for n := 0; n < len(data); n++ {
		if _, err := Decode(data[:n]); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("cut to %d bytes: err = %v, want ErrCorrupt", n, err)
		}
	}
}

// TestSaveLoad runs against the in-memory store and the fs object store:
// the newest list wins, older ones are deleted, other timelines are apart,
// and a damaged newest list is an error that names it.
func TestSaveLoad(t *testing.T) {
	fsStore, err := fs.New(fs.Config{Root: t.TempDir()}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer fsStore.Close()
	for name, st := range map[string]objectstore.Store{"memory": objectstore.NewMemory(), "fs": fsStore} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			tl1, tl2 := pg.TimelineID{1}, pg.TimelineID{2}
			if _, _, err := Load(ctx, st, tl1); !errors.Is(err, ErrNone) {
				t.Fatalf("Load of an empty store: %v, want ErrNone", err)
			}
			t0 := time.Unix(1_700_000_000, 0)
			first := sampleKeys()[:10]
			if _, err := Save(ctx, st, tl1, first, t0); err != nil {
				t.Fatal(err)
			}
			second := sampleKeys()[500:]
			name2, err := Save(ctx, st, tl1, second, t0.Add(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Save(ctx, st, tl2, first, t0.Add(2*time.Minute)); err != nil {
				t.Fatal(err)
			}
			keys, got, err := Load(ctx, st, tl1)
			if err != nil {
				t.Fatal(err)
			}
			if got != name2 {
				t.Errorf("Load read %s, want the newest %s", got, name2)
			}
			want, _ := Decode(Encode(second))
			if !slices.Equal(keys, want) {
				t.Errorf("Load returned %d keys, want %d", len(keys), len(want))
			}
			var left []string
			st.List(ctx, Prefix(tl1), func(o objectstore.ObjectInfo) error { left = append(left, o.Key); return nil })
			if !slices.Equal(left, []string{name2}) {
				t.Errorf("objects of the timeline after two saves: %v, want only %s", left, name2)
			}
			if keys, _, err := Load(ctx, st, tl2); err != nil || len(keys) != 10 {
				t.Errorf("the other timeline's list: %d keys, %v", len(keys), err)
			}

			// A damaged newest list: an error naming it, nothing decoded.
			bad := Encode(first)
			bad[len(bad)/2] ^= 1
			name3 := Prefix(tl1) + "99999999999999999999"
			if err := st.Put(ctx, name3, bytes.NewReader(bad), objectstore.PutOptions{Size: int64(len(bad))}); err != nil {
				t.Fatal(err)
			}
			keys, got, err = Load(ctx, st, tl1)
			if !errors.Is(err, ErrCorrupt) || got != name3 || keys != nil {
				t.Errorf("damaged list: keys %d, name %s, err %v; want ErrCorrupt naming %s", len(keys), got, err, name3)
			}
		})
	}
}

func TestSum(t *testing.T) {
	keys := sampleKeys()
	rev := slices.Clone(keys)
	slices.Reverse(rev)
	if Sum(keys) != Sum(rev) {
		t.Error("the sum depends on the order of the keys")
	}
	if Sum(keys) == Sum(keys[2:]) { // block 1 gone (block 0 is listed twice)
		t.Error("one page fewer, the same sum")
	}
}

// TestSaveReplyLost: a save whose create reached the store but whose reply
// was lost is retried, finds its own list there, and succeeds.
func TestSaveReplyLost(t *testing.T) {
	ctx := context.Background()
	lost := faulty.New(objectstore.NewMemory(), faulty.Config{Rules: []faulty.Rule{{Ops: faulty.OpPut, Fault: faulty.FailReply, Transient: true, Times: 1}}})
	st := objectstore.WithRetry(lost, objectstore.RetryPolicy{MaxAttempts: 3, InitialBackoff: time.Millisecond}, zerolog.Nop())
	tl := pg.TimelineID{3}
	name, err := Save(ctx, st, tl, sampleKeys(), time.Unix(1_700_000_000, 0))
	if err != nil || lost.Fired() != 1 {
		t.Fatalf("save through a lost reply: %v (%d faults)", err, lost.Fired())
	}
	keys, got, err := Load(ctx, st, tl)
	want, _ := Decode(Encode(sampleKeys()))
	if err != nil || got != name || !slices.Equal(keys, want) {
		t.Fatalf("load after it: %s, %d keys, %v", got, len(keys), err)
	}
}
