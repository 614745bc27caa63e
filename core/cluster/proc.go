package cluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
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

// procStartTime reads field 22 of /proc/PID/stat.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("cluster: bad /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, errors.New("cluster: short /proc stat")
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// Alive reports whether the process is still the one that was started.
func (p Proc) Alive() bool {
	if p.PID <= 0 {
		return false
	}
	st, err := procStartTime(p.PID)
	if err != nil || (p.StartTime != 0 && st != p.StartTime) {
		return false
	}
	// A zombie is not alive.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.PID))
	if err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && len(s) > i+2 && s[i+2] == 'Z' {
			return false
		}
	}
	return true
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
