package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stratadb/strata/internal/procfs"
)

// Every process Postgres forks calls setsid(): each backend is its own
// session and process group, so killing the postmaster's group misses them.
// When the postmaster dies by SIGKILL (a crash test, or Pdeathsig after the
// agent died) its backends are orphaned: most notice at their next latch
// wait and exit, but one blocked on a lightweight lock that a dead process
// held sleeps forever, holding its client connection and files on the old
// mount. So the agent finds what is left by name: it sets cluster_name to a
// tag of its mountpoint, Postgres puts that tag in every child's process
// title ("postgres: <tag>: ..."), and the postmaster runs "postgres -D
// <mountpoint>". The agent kills what carries the tag when the postmaster
// exits and before it starts one (the leftovers of an agent that died).

// clusterTag is the cluster_name the agent gives the Postgres it runs on
// mountpoint: unique per mountpoint, so that two computes on one machine
// never kill each other's processes.
func clusterTag(mountpoint string) string {
	sum := sha256.Sum256([]byte(filepath.Clean(mountpoint)))
	return "strata-" + hex.EncodeToString(sum[:4])
}

// reapOrphans SIGKILLs every process that runs the program exe (the
// postgres binary) and is either a child of the Postgres tagged tag (its
// title starts with "postgres: <tag>: ") or a postmaster on mountpoint (its
// arguments hold "-D <mountpoint>"). It returns how many it signalled.
func reapOrphans(exe, tag, mountpoint string) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	exe = filepath.Clean(exe)
	title := []byte("postgres: " + tag + ": ")
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		target, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || filepath.Clean(target) != exe {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if !bytes.HasPrefix(cmdline, title) && !postmasterOn(cmdline, mountpoint) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// postmasterOn reports whether a NUL-separated command line holds
// "-D <mountpoint>".
func postmasterOn(cmdline []byte, mountpoint string) bool {
	args := bytes.Split(bytes.TrimRight(cmdline, "\x00"), []byte{0})
	for i := 0; i+1 < len(args); i++ {
		if string(args[i]) == "-D" && filepath.Clean(string(args[i+1])) == filepath.Clean(mountpoint) {
			return true
		}
	}
	return false
}

// waitLockHolder waits (up to timeout) until the process that Postgres lock
// file path names (its first line: postmaster.pid, or a socket's .lock) is
// gone. A postmaster killed with its agent can take a moment to die, and
// stays a zombie until init reaps it; Postgres refuses to start while the
// PID in its lock files answers kill(pid, 0), so a zombie's lock file
// (which holds nothing any more) is removed. A missing file is fine.
func waitLockHolder(path string, timeout time.Duration) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 || pid == os.Getpid() {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for {
		switch procState(pid) {
		case 0: // gone
			return nil
		case 'Z':
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agent: process %d named by %s still runs after %s (a Postgres not started by this agent?)", pid, path, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// procState returns the state letter of process pid ('R', 'S', 'D', 'Z',
// ...), or 0 when there is no such process.
func procState(pid int) byte {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return 0
	}
	return st.State
}
