package trouble

import (
	"errors"
	"testing"
	"time"
)

// TestRun: failures start and extend a run from the first one's time, a
// success ends it, and the wire form keeps it.
func TestRun(t *testing.T) {
	t0 := time.UnixMilli(1_800_000_000_000)
	var r Run
	r.Note(t0, errors.New("first"))
	r.Note(t0.Add(time.Minute), errors.New("second"))
	if r.Failures != 2 || !r.Since.Equal(t0) || r.Err != "second" {
		t.Fatalf("after two failures: %+v", r)
	}
	if w := FromWire(r.SinceMillis(), uint32(r.Failures), r.Err); w != r {
		t.Fatalf("through the wire: %+v, want %+v", w, r)
	}
	r.Note(t0.Add(2*time.Minute), nil)
	if r != (Run{}) || r.SinceMillis() != 0 || FromWire(0, 0, "") != (Run{}) {
		t.Fatalf("after a success: %+v", r)
	}
}
