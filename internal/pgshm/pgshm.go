// Package pgshm removes the shared memory of a PostgreSQL 15 postmaster
// that was killed.
//
// A postmaster holds a small System V segment whose header names its
// dynamic shared memory control segment (/dev/shm/PostgreSQL.<handle> on
// Linux), which lists the other dynamic segments in use. A postmaster that
// exits removes them all; one killed with SIGKILL (kill -9, the OOM killer,
// the death of the process it was bound to) leaves them. The next
// postmaster on the same data directory removes them only when it finds
// the old segment by the directory's device and inode numbers, which a new
// mount of a FUSE data directory need not give again, and a data directory
// that is removed leaves them for good: each a System V segment (the
// kernel allows 4,096) and at least 1 MiB of /dev/shm. Release makes the
// same checks and the same removals as Postgres' own
// (PGSharedMemoryAttach, dsm_cleanup_using_control_segment), for the
// postmaster whose segment was noted with Of while it ran.
package pgshm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Segment is a postmaster's System V shared memory segment.
type Segment struct {
	PID   int `json:"pid"`
	ShmID int `json:"shmid"`
}

const (
	// pgShmemMagic opens every Postgres System V segment (PGShmemHeader).
	pgShmemMagic = 679834894
	// dsmControlMagic opens the dynamic shared memory control segment.
	dsmControlMagic = 0x9a503d32
	// Offsets in PGShmemHeader (64-bit Linux): magic int32, creatorPID
	// int32, totalsize and freeoffset size_t, dsm_control uint32.
	shmHdrCreator    = 4
	shmHdrDSMControl = 24
	// dsm_control_header: magic, nitems, maxitems (uint32 each), then the
	// items from offset 16, 40 bytes each: handle uint32, refcnt uint32,
	// first_page and npages size_t, a pointer, pinned bool.
	dsmItems    = 16
	dsmItemSize = 40
)

// Of finds the System V segment that postmaster pid created.
func Of(pid int) (Segment, error) {
	id, ok, err := sysvSegmentOf(pid)
	if err != nil {
		return Segment{}, err
	}
	if !ok {
		return Segment{}, fmt.Errorf("pgshm: postmaster %d holds no System V segment", pid)
	}
	return Segment{PID: pid, ShmID: id}, nil
}

// Release removes the segment, the dynamic shared memory control segment
// its header names and every dynamic segment that lists as in use, once no
// process is attached to it. It returns what it removed, and busy when
// processes are still attached (nothing removed; try again once they are
// gone). A segment that is gone, or is not that postmaster's any more (its
// creator, Postgres' magic number and creator PID in its header), leaves
// nothing to do.
func (s Segment) Release() (removed []string, busy bool, err error) {
	cpid, nattch, ok, err := sysvSegment(s.ShmID)
	if err != nil || !ok || cpid != s.PID {
		return nil, false, err
	}
	if nattch > 0 {
		return nil, true, nil
	}
	hdr, err := unix.SysvShmAttach(s.ShmID, 0, unix.SHM_RDONLY)
	if err != nil {
		return nil, false, fmt.Errorf("pgshm: attach System V segment %d: %w", s.ShmID, err)
	}
	var control uint32
	valid := len(hdr) >= shmHdrDSMControl+4 &&
		int32(binary.NativeEndian.Uint32(hdr)) == pgShmemMagic &&
		int(int32(binary.NativeEndian.Uint32(hdr[shmHdrCreator:]))) == s.PID
	if valid {
		control = binary.NativeEndian.Uint32(hdr[shmHdrDSMControl:])
	}
	if err := unix.SysvShmDetach(hdr); err != nil {
		return nil, false, err
	}
	if !valid {
		return nil, false, nil
	}
	if control != 0 {
		removed = releaseDSM(control)
	}
	if _, err := unix.SysvShmCtl(s.ShmID, unix.IPC_RMID, nil); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EIDRM) {
		return removed, false, fmt.Errorf("pgshm: remove System V segment %d: %w", s.ShmID, err)
	}
	return append(removed, "System V segment "+strconv.Itoa(s.ShmID)), false, nil
}

// dsmPath is where Postgres' posix dynamic shared memory segment handle
// lives (shm_open("/PostgreSQL.<handle>")).
func dsmPath(handle uint32) string {
	return "/dev/shm/PostgreSQL." + strconv.FormatUint(uint64(handle), 10)
}

// releaseDSM removes the control segment and every segment it lists as in
// use; a control segment that is missing or not sane is left alone (another
// dynamic_shared_memory_type, or not Postgres').
func releaseDSM(control uint32) []string {
	b, err := os.ReadFile(dsmPath(control))
	if err != nil || len(b) < dsmItems {
		return nil
	}
	nitems := binary.NativeEndian.Uint32(b[4:])
	maxitems := binary.NativeEndian.Uint32(b[8:])
	if binary.NativeEndian.Uint32(b) != dsmControlMagic || nitems > maxitems ||
		uint64(len(b)) < dsmItems+uint64(maxitems)*dsmItemSize {
		return nil
	}
	var removed []string
	for i := uint32(0); i < nitems; i++ {
		item := b[dsmItems+i*dsmItemSize:]
		handle, refcnt := binary.NativeEndian.Uint32(item), binary.NativeEndian.Uint32(item[4:])
		if refcnt == 0 || handle&1 == 1 { // unused, or in the main segment
			continue
		}
		if os.Remove(dsmPath(handle)) == nil {
			removed = append(removed, dsmPath(handle))
		}
	}
	if os.Remove(dsmPath(control)) == nil {
		removed = append(removed, dsmPath(control))
	}
	return removed
}

// sysvSegmentOf finds the System V segment that pid created.
func sysvSegmentOf(pid int) (id int, ok bool, err error) {
	err = eachSysvSegment(func(shmid, cpid, _ int) bool {
		if cpid == pid {
			id, ok = shmid, true
			return false
		}
		return true
	})
	return id, ok, err
}

// Exists reports whether the segment is still there and still the
// postmaster's (created by its PID).
func (s Segment) Exists() (bool, error) {
	cpid, _, ok, err := sysvSegment(s.ShmID)
	return ok && cpid == s.PID, err
}

// sysvSegment reports a segment's creator and how many processes are
// attached to it; ok is false when it does not exist.
func sysvSegment(id int) (cpid, nattch int, ok bool, err error) {
	err = eachSysvSegment(func(shmid, c, n int) bool {
		if shmid == id {
			cpid, nattch, ok = c, n, true
			return false
		}
		return true
	})
	return cpid, nattch, ok, err
}

// eachSysvSegment calls fn for each line of /proc/sysvipc/shm (key shmid
// perms size cpid lpid nattch ...) until it returns false.
func eachSysvSegment(fn func(shmid, cpid, nattch int) bool) error {
	b, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) < 7 {
			continue
		}
		shmid, e1 := strconv.Atoi(f[1])
		cpid, e2 := strconv.Atoi(f[4])
		nattch, e3 := strconv.Atoi(f[6])
		if e1 != nil || e2 != nil || e3 != nil {
			continue
		}
		if !fn(shmid, cpid, nattch) {
			return nil
		}
	}
	return nil
}
