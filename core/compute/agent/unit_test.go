package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

func controlBytes(version uint32, ckpt, redo pg.LSN, tli uint32) []byte {
	b := make([]byte, 8192)
	le := binary.LittleEndian
	le.PutUint64(b[0:], 7300000000000000001)
	le.PutUint32(b[8:], version)
	le.PutUint32(b[16:], 6) // DB_IN_PRODUCTION
	le.PutUint64(b[32:], uint64(ckpt))
	le.PutUint64(b[40:], uint64(redo))
	le.PutUint32(b[48:], tli)
	return b
}

func TestParseControl(t *testing.T) {
	c, err := ParseControl(controlBytes(1300, 0x1700100, 0x16FFF00, 1))
	if err != nil || c.Checkpoint != 0x1700100 || c.Redo != 0x16FFF00 || c.Timeline != 1 || c.SystemID != 7300000000000000001 {
		t.Fatalf("%+v %v", c, err)
	}
	for name, b := range map[string][]byte{
		"short":         make([]byte, 20),
		"version 1201":  controlBytes(1201, 0x1700100, 0x16FFF00, 1),
		"redo past ckp": controlBytes(1300, 0x1700100, 0x1800000, 1),
		"no timeline":   controlBytes(1300, 0x1700100, 0x16FFF00, 0),
	} {
		if _, err := ParseControl(b); !errors.Is(err, ErrControl) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestParseRealControl reads the pg_control that initdb writes.
func TestParseRealControl(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	dir := pgtest.MkdirOwned(t, "strata-control-")
	cmd, err := pgtest.Command("initdb", "-D", filepath.Join(dir, "d"), "--no-sync", "-A", "trust", "-U", "postgres")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "d", ControlFile))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParseControl(b)
	if err != nil {
		t.Fatal(err)
	}
	// initdb ends with a shutdown checkpoint in the first segment; its REDO
	// point is the checkpoint record itself.
	if c.Timeline != 1 || c.Redo != c.Checkpoint || c.Checkpoint.Segment(pg.WALSegmentSize) != 1 || c.SystemID == 0 {
		t.Fatalf("initdb's pg_control: %+v", c)
	}
}

func TestPrintReport(t *testing.T) {
	var buf bytes.Buffer
	err := PrintReport(&buf, Report{State: "running", Term: 3, Strategy: "lfc", CacheHits: 30, CacheMisses: 10,
		Waits: []WaitStat{{Name: "getpage", Count: 10, Total: 5 * time.Millisecond}, {Name: "lfc_lock", Count: 4, Total: 40 * time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if !strings.Contains(out, "75.0% hits") || len(lines) != 5 || !strings.Contains(lines[3], "lfc_lock") || !strings.Contains(lines[3], "10ms") || !strings.Contains(lines[4], "500") {
		t.Fatalf("report:\n%s", out)
	}
}
