package replication_test

import (
	"testing"

	"github.com/stratadb/strata/sdk/replication"
	"github.com/stratadb/strata/sdk/replication/replicationtest"
)

func TestMemory(t *testing.T) {
	replicationtest.Run(t, func(t *testing.T) replicationtest.Harness {
		m := replication.NewMemory(7, 0x1000000)
		t.Cleanup(func() { m.Close() })
		return replicationtest.Harness{
			Source: m, Start: 0x1000000,
			Commit: func(t *testing.T, b []byte) { m.Append(b) },
			Progress: func(c string) (replication.Progress, bool) {
				return m.Progress(c), true
			},
		}
	})
}
