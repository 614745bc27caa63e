package fusefs_test

import (
	"testing"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/fusefs/backendtest"
)

func TestMemoryAcceptance(t *testing.T) {
	backendtest.Run(t, func(*testing.T) fusefs.Backend { return fusefs.NewMemory() })
}

func TestLocalDirAcceptance(t *testing.T) {
	backendtest.Run(t, func(t *testing.T) fusefs.Backend {
		be, err := fusefs.NewLocalDir(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return be
	})
}
