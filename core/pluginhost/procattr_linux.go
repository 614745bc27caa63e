package pluginhost

import (
	"os/exec"
	"syscall"
)

// dieWithHost makes the kernel kill the plugin when the host dies, so that
// a host killed with -9 leaves no orphan plugin behind. (Linux ties this to
// the thread that started the plugin; if the Go runtime ever retires that
// thread, the plugin is killed early and restarted on the next call like
// any crashed plugin.)
func dieWithHost(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
