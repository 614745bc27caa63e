package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stratadb/strata/internal/procfs"
)

// Proc is a background process that `strata up` started and `strata down`
// stops. StartTime (the kernel's start time in clock ticks since boot)
// guards against signalling an unrelated process that reused the PID.
type Proc struct {
	Name      string   `json:"name"`
	PID       int      `json:"pid"`
	StartTime uint64   `json:"start_time"`
	Args      []string `json:"args"`
	Log       string   `json:"log"`
}

// startDetached starts bin with args in its own session (it survives the
// caller), appending its output to logPath.
func startDetached(name, bin string, args []string, logPath string, env []string) (Proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return Proc{}, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("cluster: start %s: %w", name, err)
	}
	st, _ := procStartTime(cmd.Process.Pid)
	p := Proc{Name: name, PID: cmd.Process.Pid, StartTime: st, Args: append([]string{bin}, args...), Log: logPath}
	// Reap it if it exits while we are still here; once we return it is
	// adopted by init.
	go cmd.Wait()
	return p, nil
}

// procStartTime reads the start time of process pid (procfs.Stat).
func procStartTime(pid int) (uint64, error) {
	st, err := procfs.ReadStat(pid)
	return st.StartTime, err
}

// Alive reports whether the process is still the one that was started.
func (p Proc) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	st, err := procfs.ReadStat(p.PID)
	if err != nil || (p.StartTime != 0 && st.StartTime != p.StartTime) {
		return false
	}
	return st.State != 'Z' // a zombie is not alive
}

// Stop sends SIGTERM to the process group (startDetached made the process
// a session leader), waits up to timeout, then SIGKILL. Stopping a process
// that is gone is not an error.
func (p Proc) Stop(timeout time.Duration) error {
	if !p.Alive() {
		return nil
	}
	if err := syscall.Kill(-p.PID, syscall.SIGTERM); err != nil {
		return nil
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !p.Alive() {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	for i := 0; i < 100 && p.Alive(); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("cluster: %s (pid %d) did not stop within %v; killed", p.Name, p.PID, timeout)
}

// strayProcs finds the processes of the cluster in dir that run without
// its state file (deleted, or lost with the folder): strata servers that
// lead their own session, as startDetached starts them, and name a path in
// dir on their command line (a safekeeper's or the pageserver's
// --data-dir, the compute's --mountpoint). A supervised child is in its
// supervisor's session and is stopped with it. The result is in start
// order (safekeepers, pageserver, compute), the order stopProcs expects.
func strayProcs(dir string) ([]Proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var found []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue // gone, or not ours to read
		}
		argv := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		name, ok := clusterServer(argv, dir)
		if !ok || !sessionLeader(pid) {
			continue
		}
		st, err := procStartTime(pid)
		if err != nil {
			continue
		}
		found = append(found, Proc{Name: name, PID: pid, StartTime: st, Args: argv})
	}
	rank := func(p Proc) int {
		switch {
		case isSafekeeper(p):
			return 0
		case p.Name == "pageserver":
			return 1
		}
		return 2
	}
	sort.Slice(found, func(i, j int) bool {
		if ri, rj := rank(found[i]), rank(found[j]); ri != rj {
			return ri < rj
		}
		return found[i].Name < found[j].Name
	})
	return found, nil
}

// clusterServer reports whether argv is a strata server of the cluster in
// dir (`[--config F] safekeeper|pageserver|compute ...` with an argument
// that is dir or a path in it), and its name as the state file records it.
func clusterServer(argv []string, dir string) (string, bool) {
	if len(argv) < 2 {
		return "", false
	}
	rest := argv[1:]
	if rest[0] == "--config" && len(rest) > 2 {
		rest = rest[2:]
	}
	sub := rest[0]
	if sub != "safekeeper" && sub != "pageserver" && sub != "compute" {
		return "", false
	}
	in, id := false, ""
	for i, a := range rest[1:] {
		if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(a, "--") {
			a = v
		}
		if a == dir || strings.HasPrefix(a, dir+string(filepath.Separator)) {
			in = true
		}
		if rest[i] == "--id" {
			id = a
		}
	}
	if !in {
		return "", false
	}
	if sub == "safekeeper" {
		return "safekeeper " + id, true
	}
	return sub, true
}

// sessionLeader reports whether pid leads its session.
func sessionLeader(pid int) bool {
	st, err := procfs.ReadStat(pid)
	return err == nil && st.Session == pid
}
