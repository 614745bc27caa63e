package redo_test

import (
	"testing"

	"github.com/stratadb/strata/sdk/redo"
)

func TestImagePolicies(t *testing.T) {
	p := redo.DeltaPolicy{NDeltas: 10, NBytes: 4096}
	if p.ShouldMaterialize(redo.PageHistory{Deltas: 9, DeltaBytes: 100}) {
		t.Error("9 small deltas materialized")
	}
	if !p.ShouldMaterialize(redo.PageHistory{Deltas: 10}) || !p.ShouldMaterialize(redo.PageHistory{Deltas: 1, DeltaBytes: 5000}) {
		t.Error("limits not honoured")
	}
	if (redo.DeltaPolicy{}).ShouldMaterialize(redo.PageHistory{Deltas: 1 << 20}) {
		t.Error("zero policy materialized")
	}
	if !(redo.FPIPolicy{}).ShouldMaterialize(redo.PageHistory{FPI: true}) || (redo.FPIPolicy{}).ShouldMaterialize(redo.PageHistory{Deltas: 100}) {
		t.Error("FPI policy wrong")
	}
}

func TestHotPolicy(t *testing.T) {
	p := redo.HotPolicy{DeltaPolicy: redo.DeltaPolicy{NDeltas: 10}, Burst: 3}
	cases := []struct {
		h    redo.PageHistory
		want bool
	}{
		{redo.PageHistory{Deltas: 2, Burst: 2}, false},
		{redo.PageHistory{Deltas: 3, Burst: 3}, true},  // hot: three in one batch
		{redo.PageHistory{Deltas: 10, Burst: 1}, true}, // cold but the chain is long
		{redo.PageHistory{Deltas: 9, Burst: 1}, false},
	}
	for _, c := range cases {
		if got := p.ShouldMaterialize(c.h); got != c.want {
			t.Errorf("%+v: %v, want %v", c.h, got, c.want)
		}
	}
	if (redo.HotPolicy{}).ShouldMaterialize(redo.PageHistory{Deltas: 100, Burst: 100}) {
		t.Error("zero hot policy materialized")
	}
}
