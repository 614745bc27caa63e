package agent

import "testing"

func TestSafekeeperSlot(t *testing.T) {
	for path, want := range map[string]bool{
		"pg_replslot":                          true,
		"pg_replslot/strata_sk1":               true,
		"pg_replslot/strata_sk1.tmp":           true,
		"pg_replslot/strata_sk1.tmp/state":     true,
		"pg_replslot/strata_sk3/state":         true,
		"pg_replslot/my_logical_slot":          false,
		"pg_replslot/my_logical_slot/state":    false,
		"pg_replslot/my_logical_slot/xid.snap": false,
		"pg_replslotx/strata_sk1":              false,
		"base/5/strata_sk1":                    false,
		"pg_logical/replorigin_checkpoint":     false,
		"":                                     false,
	} {
		if got := safekeeperSlot(path); got != want {
			t.Errorf("safekeeperSlot(%q) = %v, want %v", path, got, want)
		}
	}
}
