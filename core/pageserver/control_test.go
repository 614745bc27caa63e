package pageserver_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// TestControlFields checks the pg_control offsets of
// ControlCheckpointTime and ControlWithMinRecoveryPoint against PostgreSQL
// 15's own pg_controldata: the checkpoint time it
// reads, and the minimum recovery point it writes (with a CRC that
// pg_controldata accepts). A pg_control with a wrong CRC is refused.
func TestControlFields(t *testing.T) {
	if err := pgtest.Available(); err != nil {
		t.Skip(err)
	}
	srv := pgtest.Start(t, pgtest.Options{})
	srv.Stop()
	path := filepath.Join(srv.DataDir, pageserver.ControlFile)
	ctl, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before := pgtest.ControlData(t, srv.DataDir)
	at, err := pageserver.ControlCheckpointTime(ctl)
	if err != nil {
		t.Fatal(err)
	}
	want, err := time.ParseInLocation("Mon Jan _2 15:04:05 2006", before["Time of latest checkpoint"], time.Local)
	if err != nil {
		t.Fatal(err)
	}
	if !at.Equal(want) {
		t.Errorf("checkpointTime = %s, pg_controldata says %s (%q)", at, want, before["Time of latest checkpoint"])
	}

	out, err := pageserver.ControlWithMinRecoveryPoint(ctl, pg.LSN(0x3_00A2F1C8), 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	after := pgtest.ControlData(t, srv.DataDir)
	if got := after["Minimum recovery ending location"]; got != "3/A2F1C8" {
		t.Errorf("minimum recovery point %q, want 3/A2F1C8", got)
	}
	if got := after["Min recovery ending loc's timeline"]; got != "1" {
		t.Errorf("its timeline %q, want 1", got)
	}
	for k, v := range before {
		if !strings.HasPrefix(k, "Min") && after[k] != v {
			t.Errorf("%s changed: %q, was %q", k, after[k], v)
		}
	}

	bad := append([]byte(nil), ctl...)
	bad[136] ^= 0xFF // minRecoveryPoint: the CRC no longer matches
	if _, err := pageserver.ControlWithMinRecoveryPoint(bad, 1, 1); err == nil || !strings.Contains(err.Error(), "CRC") {
		t.Errorf("a pg_control with a wrong CRC: %v, want refused", err)
	}
	if _, err := pageserver.ControlCheckpointTime(ctl[:20]); err == nil {
		t.Error("a short pg_control: no error")
	}
}
