//go:build !linux

package pluginhost

import "os/exec"

// dieWithHost does nothing outside Linux: a plugin outlives a host killed
// with -9 there until it is stopped by hand.
func dieWithHost(*exec.Cmd) {}
