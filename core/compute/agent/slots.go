package agent

import (
	"strings"

	"github.com/stratadb/strata/core/safekeeper"
)

// safekeeperSlot is fusefs.Options.SendOnlyPath: pg_replslot itself and
// the folders and files of the safekeepers' slots (safekeeper.SlotPrefix,
// also while a new slot is named <slot>.tmp). A safekeeper creates its slot
// when it connects, and a durable fsync of it would wait for the quorum,
// which needs this safekeeper when another one is down.
func safekeeperSlot(path string) bool {
	rest, ok := strings.CutPrefix(path, "pg_replslot")
	if !ok {
		return false
	}
	if rest == "" {
		return true
	}
	rest, ok = strings.CutPrefix(rest, "/")
	if !ok {
		return false
	}
	name, _, _ := strings.Cut(rest, "/")
	return strings.HasPrefix(name, safekeeper.SlotPrefix)
}
