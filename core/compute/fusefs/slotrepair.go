package fusefs

import (
	"context"
	"fmt"
	"strings"
)

// repairSlotFolders removes the replication slot folders that an
// interrupted folder rename left without a state file, and returns files
// without them.
//
// Postgres creates a slot as pg_replslot/<name>.tmp and renames the folder
// to <name> once its state file is durable, and drops one by renaming
// <name> to <name>.tmp before it removes it; at start it removes every
// <name>.tmp and reads <name>/state of every other folder, and a folder
// without one stops the server (PANIC: could not open file
// "pg_replslot/<name>/state"). A rename here is not atomic in storage
// (renameDir: the new folder, then each file, then the old folder), so an
// agent that dies in the middle leaves <name> empty beside a <name>.tmp
// that holds the state. Without <name>, Postgres sees the rename as not
// done (a create: the slot does not exist, and a safekeeper creates it
// again) or done (a drop), as after its own crash on a local disk.
func (f *FS) repairSlotFolders(ctx context.Context, files []FileInfo) ([]FileInfo, error) {
	const dir = "pg_replslot/"
	hasState := map[string]bool{}
	var slots []string
	for _, fi := range files {
		rest, ok := strings.CutPrefix(fi.Path, dir)
		if !ok || rest == "" {
			continue
		}
		name, file, nested := strings.Cut(rest, "/")
		switch {
		case !nested && fi.Dir && !strings.HasSuffix(name, ".tmp"):
			slots = append(slots, name)
		case nested && file == "state" && !fi.Dir:
			hasState[name] = true
		}
	}
	drop := map[string]bool{}
	for _, name := range slots {
		if hasState[name] {
			continue
		}
		folder := dir + name
		var inside []string
		for _, fi := range files {
			if strings.HasPrefix(fi.Path, folder+"/") {
				inside = append(inside, fi.Path)
			}
		}
		w := f.wal.Current()
		for _, p := range inside {
			if err := f.be.Remove(ctx, p, w); err != nil {
				return nil, fmt.Errorf("fusefs: removing %s of slot folder %s, which has no state file: %w", p, folder, err)
			}
			drop[p] = true
		}
		if err := f.be.Remove(ctx, folder, w); err != nil {
			return nil, fmt.Errorf("fusefs: removing slot folder %s, which has no state file: %w", folder, err)
		}
		drop[folder] = true
		f.log.Warn().Str("folder", folder).Strs("files", inside).
			Msg("fusefs: removed a replication slot folder without a state file (an agent stopped while Postgres renamed it); Postgres would not start with it")
	}
	if len(drop) == 0 {
		return files, nil
	}
	kept := files[:0:0]
	for _, fi := range files {
		if !drop[fi.Path] {
			kept = append(kept, fi)
		}
	}
	return kept, nil
}
