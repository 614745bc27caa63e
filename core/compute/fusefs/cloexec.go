package fusefs

import (
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// closeFUSEOnExec marks every descriptor of this process that is open on
// /dev/fuse close-on-exec. go-fuse's direct mount opens /dev/fuse without
// O_CLOEXEC, so Postgres, started by the agent after the mount, would
// inherit the FUSE connection: when the agent then dies (kill -9), the
// kernel keeps the connection open on Postgres' behalf, nobody serves it,
// and every Postgres process touching PGDATA hangs in uninterruptible sleep
// instead of failing with ENOTCONN, and the mountpoint cannot be reused.
func closeFUSEOnExec() error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return err
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || target != "/dev/fuse" {
			continue
		}
		syscall.CloseOnExec(fd)
	}
	return nil
}
