package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
)

// modelSegments are the pieces random keys are made of: characters on both
// sides of '/', escapes, dots, a long segment, and segments that are
// prefixes of one another.
var modelSegments = []string{
	"a", "a.b", "a-", "a0", "ab", "b", "%", "%25", ".x", "é", "sp ace", "~",
	strings.Repeat("l", 250),
}

func randomKey(rng *rand.Rand) string {
	n := 1 + rng.IntN(3)
	segs := make([]string, n)
	for i := range segs {
		segs[i] = modelSegments[rng.IntN(len(modelSegments))]
	}
	return strings.Join(segs, "/")
}

// errClass reduces an error to what the contract promises about it.
func errClass(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, objectstore.ErrNotFound):
		return "not found"
	case errors.Is(err, objectstore.ErrExists):
		return "exists"
	case errors.Is(err, objectstore.ErrInvalidRange):
		return "invalid range"
	case errors.Is(err, objectstore.ErrInvalidKey):
		return "invalid key"
	default:
		return "error: " + err.Error()
	}
}

// testMatchesReference applies one random sequence of operations to the
// store and to the in-memory reference store, and requires the same
// answers: same errors (by sentinel), same bytes, same listings.
func (s *suite) testMatchesReference(t *testing.T) {
	st := s.store(t)
	ref := objectstore.NewMemory()
	defer ref.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(uint64(s.opts.ModelOps), 42))
	read := func(rc io.ReadCloser, err error) (string, []byte) {
		if err != nil {
			return errClass(err), nil
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			return "read error: " + err.Error(), nil
		}
		return "ok", b
	}
	list := func(st objectstore.Store, prefix string) (string, []string) {
		var out []string
		err := st.List(ctx, prefix, func(oi objectstore.ObjectInfo) error {
			out = append(out, fmt.Sprintf("%s:%d", oi.Key, oi.Size))
			return nil
		})
		return errClass(err), out
	}
	hits := 0         // reads that found something
	var used []string // keys put so far: half the operations reuse one
	for i := 0; i < s.opts.ModelOps; i++ {
		key := randomKey(rng)
		if len(used) > 0 && rng.IntN(2) == 0 {
			key = used[rng.IntN(len(used))]
		}
		var op string
		var gotRes, wantRes string
		var got, want []byte
		switch r := rng.IntN(100); {
		case r < 35:
			cond := rng.IntN(3) == 0
			op = fmt.Sprintf("Put(%q, IfNotExists %v)", key, cond)
			data := Pattern{Seed: uint64(i)}.Bytes(0, int64(rng.IntN(3000)))
			o := objectstore.PutOptions{IfNotExists: cond, Size: int64(len(data))}
			gotRes = errClass(st.Put(ctx, key, bytes.NewReader(data), o))
			wantRes = errClass(ref.Put(ctx, key, bytes.NewReader(data), o))
			used = append(used, key)
		case r < 50:
			op = fmt.Sprintf("Delete(%q)", key)
			gotRes = errClass(st.Delete(ctx, key))
			wantRes = errClass(ref.Delete(ctx, key))
		case r < 65:
			op = fmt.Sprintf("Get(%q)", key)
			gotRes, got = read(st.Get(ctx, key))
			wantRes, want = read(ref.Get(ctx, key))
		case r < 80:
			off, n := int64(rng.IntN(3200)), int64(rng.IntN(2000)-500)
			op = fmt.Sprintf("GetRange(%q, %d, %d)", key, off, n)
			gotRes, got = read(st.GetRange(ctx, key, off, n))
			wantRes, want = read(ref.GetRange(ctx, key, off, n))
		case r < 88:
			op = fmt.Sprintf("Stat(%q)", key)
			gi, gerr := st.Stat(ctx, key)
			wi, werr := ref.Stat(ctx, key)
			gotRes, wantRes = errClass(gerr), errClass(werr)
			if gerr == nil && werr == nil && (gi.Key != wi.Key || gi.Size != wi.Size) {
				t.Fatalf("op %d %s: got {%q %d}, reference {%q %d}", i, op, gi.Key, gi.Size, wi.Key, wi.Size)
			}
		default:
			prefix := key[:rng.IntN(len(key)+1)]
			op = fmt.Sprintf("List(%q)", prefix)
			var gk, wk []string
			gotRes, gk = list(st, prefix)
			wantRes, wk = list(ref, prefix)
			got, want = []byte(strings.Join(gk, "\n")), []byte(strings.Join(wk, "\n"))
		}
		if wantRes == "ok" && !strings.HasPrefix(op, "Put") && !strings.HasPrefix(op, "Delete") {
			hits++
		}
		if gotRes != wantRes {
			t.Fatalf("op %d %s: got %s, reference store says %s", i, op, gotRes, wantRes)
		}
		if !bytes.Equal(got, want) {
			if strings.HasPrefix(op, "List") {
				t.Fatalf("op %d %s:\n got\n%s\n reference\n%s", i, op, got, want)
			}
			wantBytes(t, fmt.Sprintf("op %d %s (compared with the reference store)", i, op), got, want)
		}
	}
	if hits < s.opts.ModelOps/10 {
		t.Fatalf("suite bug: only %d of %d operations read an existing object", hits, s.opts.ModelOps)
	}
	_, gk := list(st, "")
	_, wk := list(ref, "")
	if strings.Join(gk, "\n") != strings.Join(wk, "\n") {
		t.Fatalf("final listing differs:\n got %q\n reference %q", gk, wk)
	}
}
