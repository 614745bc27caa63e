package walingest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/replication"
)

// TestRunStreamRefusesMidRecordStart: a start LSN that is not 8-byte
// aligned lies inside a record; RunStream says so at once instead of
// streaming and reading 4 bytes there as a record's length (which could
// make it wait forever for a record that never comes).
func TestRunStreamRefusesMidRecordStart(t *testing.T) {
	in := &Ingester{}
	var src replication.Source // never reached
	_, err := in.RunStream(context.Background(), src, "pageserver", 0x2231F1F)
	if !errors.Is(err, wal.ErrCorrupt) || !strings.Contains(err.Error(), "0/2231F1F") {
		t.Fatalf("RunStream at 0/2231F1F: %v, want ErrCorrupt naming the LSN", err)
	}
}
