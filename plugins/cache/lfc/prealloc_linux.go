package lfc

import (
	"os"
	"syscall"
)

// preallocate makes f exactly size bytes, allocating the disk blocks when
// it grows (so that a full disk shows at Resize, not at a later pwrite).
func preallocate(f *os.File, old, size int64) error {
	if size > old {
		err := syscall.Fallocate(int(f.Fd()), 0, old, size-old)
		if err == nil {
			return nil
		}
		if err != syscall.EOPNOTSUPP && err != syscall.ENOSYS {
			return err
		}
	}
	return f.Truncate(size)
}
