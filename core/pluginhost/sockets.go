package pluginhost

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
)

// socketBase holds one folder per host process for its plugins' Unix
// sockets (go-plugin's PLUGIN_UNIX_SOCKET_DIR).
var socketBase = filepath.Join(os.TempDir(), "strata-plugin-sockets")

var socketDirOnce struct {
	sync.Once
	dir string
	err error
}

// socketDir returns <tmp>/strata-plugin-sockets/<pid>, the folder this
// process's plugins create their sockets in. A plugin killed with SIGKILL
// (a crash, or its host's death) leaves its socket behind; the first
// launch in a process removes the folders of processes that are gone, so
// sockets do not pile up in the temporary folder.
func socketDir() (string, error) {
	socketDirOnce.Do(func() {
		socketDirOnce.dir, socketDirOnce.err = makeSocketDir(socketBase, os.Getpid())
	})
	return socketDirOnce.dir, socketDirOnce.err
}

func makeSocketDir(base string, pid int) (string, error) {
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	// Hosts of other users share the base, as they share /tmp.
	if fi, err := os.Stat(base); err == nil && fi.Mode().Perm() != 0o777 {
		_ = os.Chmod(base, 0o777|os.ModeSticky)
	}
	sweepSocketDirs(base, pid)
	dir := filepath.Join(base, strconv.Itoa(pid))
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	return dir, nil
}

// sweepSocketDirs removes the folders under base of processes that no
// longer run (self is this process).
func sweepSocketDirs(base string, self int) {
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self || !e.IsDir() {
			continue
		}
		if syscall.Kill(pid, 0) == syscall.ESRCH {
			_ = os.RemoveAll(filepath.Join(base, e.Name()))
		}
	}
}
