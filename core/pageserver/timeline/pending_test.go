package timeline

import (
	"slices"
	"testing"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
)

// TestSnapKeepsPendingAReadNeeds: a read's snapshot holds, of the key's
// pending versions, those at or below its LSN from the newest base on.
func TestSnapKeepsPendingAReadNeeds(t *testing.T) {
	commit := &CommitLSN{}
	tl := openT(t, t.TempDir(), commit, nil, pg.TimelineID{0x5A}, nil, 0)
	defer tl.Close()
	k := keyspace.RelBlock(rel.Page(3))
	cs := []Change{
		{Key: k, LSN: 10, Kind: layer.Image, Data: page(1)},
		{Key: k, LSN: 20, Kind: layer.Delta, Data: []byte("d20")},
		{Key: k, LSN: 30, Kind: layer.Image, Data: page(3)},
		{Key: k, LSN: 40, Kind: layer.Delta, Data: []byte("d40")},
		{Key: k, LSN: 50, Kind: layer.Delta, Data: []byte("d50")},
	}
	tl.writeMu.Lock()
	err := tl.putLocked(cs, true, false)
	tl.writeMu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		upto pg.LSN
		want []pg.LSN
	}{
		{5, nil},
		{10, []pg.LSN{10}},
		{25, []pg.LSN{10, 20}},
		{30, []pg.LSN{30}},
		{45, []pg.LSN{30, 40}},
		{LatestLSN, []pg.LSN{30, 40, 50}},
	} {
		var got []pg.LSN
		for _, v := range tl.snap(k, tc.upto).pending {
			got = append(got, v.LSN)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("pending versions in a snapshot at %s: %v, want %v", tc.upto, got, tc.want)
		}
	}
	if got := tl.LSNs().Durable; got != 9 {
		t.Errorf("durable %s with the lowest pending version at 10, want 0/9", got)
	}
}
