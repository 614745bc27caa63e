//go:build !linux

package lfc

import "os"

// preallocate makes f exactly size bytes (sparse where fallocate is missing).
func preallocate(f *os.File, _, size int64) error { return f.Truncate(size) }

// openDirect creates (truncates) the disk tier's file; O_DIRECT is Linux
// only here.
func openDirect(path string) (*os.File, bool, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	return f, false, err
}
