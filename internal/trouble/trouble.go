// Package trouble keeps the current run of failures of a step a server
// repeats (an upload, an archive step), for the status it reports: since
// when the step fails, how many times in a row, and the last error.
package trouble

import "time"

// Run is a run of failures. The zero value: the last step succeeded (or
// none was tried).
type Run struct {
	// Since: the first failure of the run; Failures: how many in a row;
	// Err: the last one's error.
	Since    time.Time
	Failures int
	Err      string
}

// Note records the outcome of one step, taken at now: a success ends the
// run, a failure starts or extends it.
func (r *Run) Note(now time.Time, err error) {
	if err == nil {
		*r = Run{}
		return
	}
	if r.Failures == 0 {
		r.Since = now
	}
	r.Failures++
	r.Err = err.Error()
}

// SinceMillis is Since in Unix milliseconds, 0 for no run (for the wire).
func (r Run) SinceMillis() int64 {
	if r.Failures == 0 {
		return 0
	}
	return r.Since.UnixMilli()
}

// FromWire is the Run a status message carries (see SinceMillis).
func FromWire(sinceMillis int64, failures uint32, err string) Run {
	if failures == 0 {
		return Run{}
	}
	return Run{Since: time.UnixMilli(sinceMillis), Failures: int(failures), Err: err}
}
