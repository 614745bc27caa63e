package safekeeper

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the skproc binary's folder after the tests (it was
// left in /tmp by every run: 58 of them, 23 MB each, on one machine).
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
