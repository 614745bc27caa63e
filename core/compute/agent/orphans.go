package agent

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// The postmaster runs in its own process group (Setsid), and every backend
// it forks stays in that group. When the postmaster dies by SIGKILL (a crash
// test, or Pdeathsig after the agent died) its backends are orphaned: most
// notice at their next latch wait and exit, but one blocked on a lightweight
// lock that a dead process held sleeps forever, holding its client
// connection and files on the old mount. So the agent kills what is left of
// the group when the postmaster exits, and, at start, what is left of the
// group recorded by an agent that died (pgidFile in the scratch folder).

const pgidFile = "postgres.pgid"

// reapGroup SIGKILLs every process of process group pgid that runs the
// program exe (the postgres binary), so that a recycled group ID can never
// hit an unrelated process. It returns how many it signalled.
func reapGroup(pgid int, exe string) int {
	if pgid <= 1 {
		return 0
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces, so split
		// after its closing parenthesis.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[2] != strconv.Itoa(pgid) {
			continue
		}
		if target, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe")); err != nil || filepath.Clean(target) != filepath.Clean(exe) {
			continue
		}
		if syscall.Kill(pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// reapRecorded kills what is left of the process group that pgidFile in
// scratch names (an earlier agent's Postgres), then removes the file.
func reapRecorded(scratch, exe string) int {
	p := filepath.Join(scratch, pgidFile)
	b, err := os.ReadFile(p)
	if err != nil {
		return 0
	}
	os.Remove(p)
	pgid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return reapGroup(pgid, exe)
}

func recordGroup(scratch string, pgid int) error {
	return os.WriteFile(filepath.Join(scratch, pgidFile), []byte(strconv.Itoa(pgid)+"\n"), 0o644)
}
