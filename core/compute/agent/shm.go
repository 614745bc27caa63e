package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/stratadb/strata/internal/pgshm"
)

// The shared memory of a postmaster that was killed (internal/pgshm): every
// start of the agent is a new FUSE mount, whose device number the kernel
// need not give again, so the next postmaster may not find it by itself,
// and each crash would leak a System V segment and at least 1 MiB of
// /dev/shm. The agent notes the segment of each postmaster it starts in
// the scratch folder (which outlives the agent) and, once the postmaster
// is gone and again before the next one starts, removes what it left.

const shmNoteFile = "postmaster-shm.json"

// shmMu keeps the removal after a postmaster's exit and the one before the
// next start apart.
var shmMu sync.Mutex

// noteShm writes down the System V segment that postmaster pid created.
func noteShm(scratch string, pid int) error {
	seg, err := pgshm.Of(pid)
	if err != nil {
		return err
	}
	b, err := json.Marshal(seg)
	if err != nil {
		return err
	}
	p := filepath.Join(scratch, shmNoteFile)
	if err := os.WriteFile(p+".tmp", b, 0o600); err != nil {
		return err
	}
	return os.Rename(p+".tmp", p)
}

// releaseShm releases the segment of the scratch folder's note, and drops
// the note unless processes are still attached (busy: the next call tries
// again). No note, nothing to do.
func releaseShm(scratch string) (removed []string, busy bool, err error) {
	shmMu.Lock()
	defer shmMu.Unlock()
	p := filepath.Join(scratch, shmNoteFile)
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	var seg pgshm.Segment
	if err := json.Unmarshal(b, &seg); err != nil {
		return nil, false, errors.Join(fmt.Errorf("%s: %w", p, err), os.Remove(p))
	}
	removed, busy, err = seg.Release()
	if err != nil || busy {
		return removed, busy, err
	}
	return removed, false, os.Remove(p)
}
