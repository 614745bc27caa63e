package timeline

import (
	"context"
	"slices"
	"testing"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// oneMapScan is ScanKeys as it was until 2026-12-05: every key of r in one
// map, sorted, then fn for each.
func oneMapScan(ctx context.Context, t *Timeline, r keyspace.Range, upto pg.LSN, fn func(keyspace.Key) error) error {
	set := map[keyspace.Key]bool{}
	walk := func(rd *layer.Reader, r keyspace.Range, upto pg.LSN, set map[keyspace.Key]bool) {
		for i := rd.Seek(r.Start); i < rd.Len(); i++ {
			e := rd.Entry(i)
			if !e.Key.Less(r.End) {
				break
			}
			if e.LSN <= upto {
				set[e.Key] = true
			}
		}
	}
	if err := t.scanWith(ctx, r, upto, set, func(keyspace.Key) bool { return true }, walk); err != nil {
		return err
	}
	for _, k := range sortedKeys(set) {
		if err := fn(k); err != nil {
			return err
		}
	}
	return nil
}

// scanInWindows checks that ScanKeys over every key of tl at upto, in
// windows of window keys, gives the keys oneMapScan gives.
func scanInWindows(t *testing.T, tl *Timeline, upto pg.LSN, window int) []keyspace.Key {
	t.Helper()
	ctx := context.Background()
	tl.opts.scanWindow = window
	defer func() { tl.opts.scanWindow = 0 }()
	var got, want []keyspace.Key
	if err := tl.ScanKeys(ctx, keyspace.All, upto, func(k keyspace.Key) error { got = append(got, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if err := oneMapScan(ctx, tl, keyspace.All, upto, func(k keyspace.Key) error { want = append(want, k); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("keys at %s in windows of %d: %v; one map of every key: %v", upto, window, got, want)
	}
	return got
}
