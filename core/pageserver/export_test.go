package pageserver

import "time"

// SetListEvery shortens the wait between two listings of a store that did
// not answer at New, for the test; it returns the function that restores it.
func SetListEvery(d time.Duration) func() {
	old := listEvery
	listEvery = d
	return func() { listEvery = old }
}
