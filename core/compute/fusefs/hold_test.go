package fusefs

import (
	"os"
	"testing"
	"time"
)

// TestHold keeps a mount up for manual poking (STRATA_FUSE_HOLD=seconds).
func TestHold(t *testing.T) {
	s := os.Getenv("STRATA_FUSE_HOLD")
	if s == "" {
		t.Skip("STRATA_FUSE_HOLD not set")
	}
	d, _ := time.ParseDuration(s)
	e := newEnv(t)
	e.mount(t, NewMemory(), nil)
	os.WriteFile("/tmp/fusehold", []byte(e.mnt), 0o644)
	time.Sleep(d)
}
