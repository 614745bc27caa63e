package lfc

import (
	"errors"
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

// openDirect creates (truncates) the disk tier's file with O_DIRECT, or
// without it where the filesystem refuses (tmpfs): direct reports which.
func openDirect(path string) (f *os.File, direct bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|syscall.O_DIRECT, 0o600)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, syscall.EINVAL) {
		return nil, false, err
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	return f, false, err
}
