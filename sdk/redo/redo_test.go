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
