//go:build !linux

package lfc

import "os"

// preallocate makes f exactly size bytes (sparse where fallocate is missing).
func preallocate(f *os.File, _, size int64) error { return f.Truncate(size) }
