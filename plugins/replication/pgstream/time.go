package pgstream

import "time"

// timeAfter is the back-off between failover rounds.
func timeAfter(attempt int) <-chan time.Time {
	return time.After(time.Duration(min(attempt+1, 10)) * 100 * time.Millisecond)
}
