package e2e

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMain removes the psproc binary's folder after the tests (it was
// left in /tmp by every run).
func TestMain(m *testing.M) {
	code := m.Run()
	if psprocPath != "" {
		os.RemoveAll(filepath.Dir(psprocPath))
	}
	os.Exit(code)
}
