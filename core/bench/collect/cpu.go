package collect

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/stratadb/strata/internal/procfs"
)

// CPU is where the machine's CPU went during a window, in percent of the
// whole machine (all cores = 100).
type CPU struct {
	Cores int
	// Busy is the machine's non-idle share (/proc/stat), steal included.
	Busy float64
	// Steal is the share of the machine's time that the hypervisor gave
	// to other guests while this one had work to run (/proc/stat's steal
	// column). On a virtual machine it varies from minute to minute and
	// slows every process alike, which no per-process figure shows.
	Steal float64
	// Target is the server's processes (and their descendants), Driver is
	// this process and its children, Other everything else.
	Target, Driver, Other float64
	// Parts splits Target by the parts Who.Parts names (a share of the
	// whole machine each, like Target); the target's processes under no
	// part's root are in Target only.
	Parts map[string]float64
	// PGKinds splits the Postgres processes of Target (those of the part
	// "postgres", or all of comm "postgres" when no part names them) by
	// their role, as their process title says: "backends" (client
	// sessions), "walsenders" and "background" (the postmaster, the WAL
	// writer, checkpointer, background writer, autovacuum and the other
	// auxiliary processes, and backends that exited during the window,
	// whose time the postmaster reaps). Nil when the target has no
	// Postgres process.
	PGKinds map[string]float64
	// TopOther lists the busiest other processes.
	TopOther []Proc
}

// Proc is one process's CPU share.
type Proc struct {
	PID  int
	Comm string
	Pct  float64
}

// procStat is one process's CPU: ticks is its own time plus the time of
// the children it has reaped (utime+stime+cutime+cstime), so that a
// backend that exits during a window still counts, in its parent.
type procStat struct {
	ppid  int
	comm  string
	ticks uint64
	// kind is a Postgres process's role (PGKind of its title); empty for
	// other programs.
	kind string
}

type cpuSnap struct {
	total, idle, steal uint64
	cores              int
	procs              map[int]procStat
}

func readCPU() cpuSnap {
	s := cpuSnap{procs: map[int]procStat{}}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if f[0] == "cpu" {
				for i, x := range f[1:] {
					v, _ := strconv.ParseUint(x, 10, 64)
					if i == 8 || i == 9 { // guest time is already in user
						continue
					}
					s.total += v
					if i == 3 || i == 4 {
						s.idle += v
					}
					if i == 7 {
						s.steal += v
					}
				}
			} else if strings.HasPrefix(f[0], "cpu") {
				s.cores++
			}
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			if p.comm == "postgres" {
				b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
				p.kind = PGKind(string(b))
			}
			s.procs[pid] = p
		}
	}
	return s
}

func readProc(pid int) (procStat, bool) {
	st, err := procfs.ReadStat(pid)
	if err != nil {
		return procStat{}, false
	}
	return procStat{ppid: st.PPID, comm: st.Comm, ticks: st.Ticks}, true
}

// Postgres process kinds (CPU.PGKinds).
const (
	PGBackends   = "backends"
	PGWalsenders = "walsenders"
	PGBackground = "background"
)

// PGKind is the role of a Postgres process with command line cmdline (its
// process title: "postgres: walsender USER HOST STATE", "postgres:
// checkpointer", "postgres: USER DB HOST STATE" for a client's backend,
// each with "NAME: " after "postgres: " when cluster_name is set; the
// postmaster keeps its own command line).
func PGKind(cmdline string) string {
	title, ok := strings.CutPrefix(strings.TrimRight(cmdline, "\x00"), "postgres: ")
	if !ok {
		return PGBackground // the postmaster: "/usr/lib/.../postgres\x00-D\x00..."
	}
	// Postgres 15 titles a cluster_name'd server "postgres: NAME: ROLE".
	role := title
	if i := strings.Index(title, ": "); i >= 0 && !strings.ContainsAny(title[:i], " ") {
		role = title[i+2:]
	}
	if strings.HasPrefix(role, "walsender") {
		return PGWalsenders
	}
	// A client's backend names its client third: "127.0.0.1(5432)",
	// "host(port)" or "[local]"; auxiliary processes and background
	// workers ("checkpointer", "autoprewarm leader") name none.
	if f := strings.Fields(role); len(f) >= 3 && (f[2] == "[local]" || strings.HasSuffix(f[2], ")") && strings.Contains(f[2], "(")) {
		return PGBackends
	}
	return PGBackground
}

// descends reports whether pid is one of roots or descends from one.
func descends(procs map[int]procStat, pid int, roots map[int]bool) bool {
	for i := 0; i < 64 && pid > 1; i++ {
		if roots[pid] {
			return true
		}
		p, ok := procs[pid]
		if !ok {
			return false
		}
		pid = p.ppid
	}
	return false
}

// nearest returns the part of pid's nearest ancestor (pid itself
// included) that parts names.
func nearest(procs map[int]procStat, pid int, parts map[int]string) (string, bool) {
	for i := 0; i < 64 && pid > 1; i++ {
		if name, ok := parts[pid]; ok {
			return name, true
		}
		p, ok := procs[pid]
		if !ok {
			break
		}
		pid = p.ppid
	}
	return "", false
}

// Who names the target's processes on this machine.
type Who struct {
	// PIDs are the target's root processes: they and their descendants.
	PIDs []int
	// Names, used without PIDs, are the names (comm, as in
	// /proc/PID/comm) of the target's processes: a server reached by URL
	// whose helpers run here too (a strata cluster: "postgres",
	// "strata"). Default: postgres and pg_receivewal. This program and
	// its children count as the driver whatever their name.
	Names []string
	// Parts, optional, names the programs the target is made of, each
	// with its root PIDs (stock-sync: "postgres" and "receivers"; a
	// strata cluster: "postgres", "safekeepers", "pageserver", "agent").
	// A target process counts in the part of its nearest root, itself
	// included: Postgres, a child of the compute agent, counts as
	// "postgres", not "agent".
	Parts map[string][]int
}

// DefaultNames are the process names of a target known by URL only.
var DefaultNames = []string{"postgres", "pg_receivewal"}

func cpuDelta(a, b cpuSnap, who Who) CPU {
	targetPIDs := who.PIDs
	names := who.Names
	if len(names) == 0 {
		names = DefaultNames
	}
	out := CPU{Cores: b.cores}
	total := float64(b.total - a.total)
	if total <= 0 {
		return out
	}
	out.Busy = 100 * (total - float64(b.idle-a.idle)) / total
	if b.steal >= a.steal {
		out.Steal = 100 * float64(b.steal-a.steal) / total
	}
	roots := map[int]bool{}
	for _, p := range targetPIDs {
		roots[p] = true
	}
	self := map[int]bool{os.Getpid(): true}
	partOf := map[int]string{}
	for name, pids := range who.Parts {
		for _, p := range pids {
			partOf[p] = name
		}
	}
	if len(partOf) > 0 {
		out.Parts = map[string]float64{}
		for name := range who.Parts {
			out.Parts[name] = 0
		}
	}
	// A process that exited during the window and was reaped by a parent
	// still running moved all its time into that parent's children time:
	// the part it had used before the window is taken off the parent.
	before := map[int]uint64{}
	for pid, p0 := range a.procs {
		if _, alive := b.procs[pid]; !alive {
			if _, ok := b.procs[p0.ppid]; ok {
				before[p0.ppid] += p0.ticks
			}
		}
	}
	var others []Proc
	for pid, p := range b.procs {
		d := p.ticks
		if p0, ok := a.procs[pid]; ok && p0.ticks <= d {
			d -= p0.ticks
		}
		d -= min(d, before[pid])
		if d == 0 {
			continue
		}
		pct := 100 * float64(d) / total
		switch {
		case len(roots) > 0 && descends(b.procs, pid, roots):
			out.Target += pct
			name, ok := nearest(b.procs, pid, partOf)
			if ok {
				out.Parts[name] += pct
			}
			if p.kind != "" && (len(partOf) == 0 || name == "postgres") {
				addKind(&out, p.kind, pct)
			}
		case descends(b.procs, pid, self):
			out.Driver += pct
		case len(roots) == 0 && slices.Contains(names, p.comm):
			out.Target += pct
			if p.kind != "" {
				addKind(&out, p.kind, pct)
			}
		default:
			out.Other += pct
			others = append(others, Proc{PID: pid, Comm: p.comm, Pct: pct})
		}
	}
	sort.Slice(others, func(i, j int) bool { return others[i].Pct > others[j].Pct })
	if len(others) > 5 {
		others = others[:5]
	}
	out.TopOther = others
	return out
}

func addKind(c *CPU, kind string, pct float64) {
	if c.PGKinds == nil {
		c.PGKinds = map[string]float64{PGBackends: 0, PGWalsenders: 0, PGBackground: 0}
	}
	c.PGKinds[kind] += pct
}

// TargetCPU measures, over d, the share of the machine (all cores = 100)
// that the target's processes use.
func TargetCPU(ctx context.Context, who Who, d time.Duration) (float64, error) {
	a := readCPU()
	select {
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-time.After(d):
	}
	return cpuDelta(a, readCPU(), who).Target, nil
}
