// Package procfs reads the line of Linux's /proc/PID/stat that strata
// needs to find and watch processes: the servers `strata up` started,
// Postgres' children, the CPU the bench charges to each part.
package procfs

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ErrFormat: a stat line that does not parse (never from a real kernel).
var ErrFormat = errors.New("procfs: bad stat line")

// Stat is what strata uses of one process's /proc/PID/stat (proc(5)).
type Stat struct {
	PID  int
	Comm string // the executable's name, at most 15 bytes
	// State is R, S, D, Z, T, ...
	State   byte
	PPID    int
	Session int
	// Ticks is the CPU time in clock ticks of the process and of its
	// waited-for children: utime + stime + cutime + cstime.
	Ticks uint64
	// StartTime is when the process started, in clock ticks after boot:
	// with the PID it names one process, across PID reuse.
	StartTime uint64
}

// ReadStat reads /proc/PID/stat; the error wraps fs.ErrNotExist when
// there is no such process.
func ReadStat(pid int) (Stat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	return ParseStat(string(b))
}

// ParseStat parses a stat line. The command name sits in parentheses and
// may itself hold spaces and parentheses, so the fields after it are
// counted from the last ')'.
func ParseStat(line string) (Stat, error) {
	open, close := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 1 || close < open {
		return Stat{}, fmt.Errorf("%w: %q", ErrFormat, line)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line[:open]))
	if err != nil {
		return Stat{}, fmt.Errorf("%w: %q", ErrFormat, line)
	}
	// After the name: state(0) ppid(1) pgrp(2) session(3) tty_nr(4)
	// tpgid(5) flags(6) minflt(7) cminflt(8) majflt(9) cmajflt(10)
	// utime(11) stime(12) cutime(13) cstime(14) priority(15) nice(16)
	// num_threads(17) itrealvalue(18) starttime(19).
	f := strings.Fields(line[close+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("%w: %q", ErrFormat, line)
	}
	s := Stat{PID: pid, Comm: line[open+1 : close], State: f[0][0]}
	num := func(i int) int64 {
		v, e := strconv.ParseInt(f[i], 10, 64)
		if e != nil && err == nil {
			err = fmt.Errorf("%w: field %d of %q", ErrFormat, i+3, line)
		}
		return v
	}
	s.PPID, s.Session = int(num(1)), int(num(3))
	for _, i := range []int{11, 12, 13, 14} {
		s.Ticks += uint64(max(num(i), 0))
	}
	s.StartTime = uint64(max(num(19), 0))
	if err != nil {
		return Stat{}, err
	}
	return s, nil
}
