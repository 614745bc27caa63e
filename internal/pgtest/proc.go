package pgtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/internal/pgshm"
	"github.com/stratadb/strata/internal/procfs"
)

// Proc is a postmaster that a test started on a data directory it prepared
// itself (a FUSE mount, a restored basebackup), as opposed to Server, which
// also runs initdb. It listens on 127.0.0.1 and a Unix socket in the folder
// given to StartOn and logs there (postgres-<port>.log).
type Proc struct {
	t       testing.TB
	cmd     *exec.Cmd
	Port    int
	LogPath string
	done    chan error
}

// StartOn starts Postgres on pgdata as the postgres OS user, with its
// socket and log in dir, on port (0: a free one), and waits up to 90 s until
// it accepts connections. The test's cleanup stops it (Stop).
func StartOn(t testing.TB, pgdata, dir string, port int) *Proc {
	t.Helper()
	if port == 0 {
		port = FreePort(t)
	}
	cmd, err := Command("postgres", "-D", pgdata, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="+dir)
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, fmt.Sprintf("postgres-%d.log", port))
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	p := &Proc{t: t, cmd: cmd, Port: port, LogPath: logPath, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(p.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, p.URL())
		if err == nil {
			c.Close(ctx)
			return p
		}
		select {
		case err := <-p.done:
			p.cmd = nil
			t.Fatalf("postgres exited: %v\n%s", err, p.Tail())
		default:
		}
		if ctx.Err() != nil {
			t.Fatalf("postgres did not start: %v\n%s", err, p.Tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URL is the connection string of the postgres database.
func (p *Proc) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.Port)
}

// Tail returns the last 3,000 bytes of the server log.
func (p *Proc) Tail() string {
	b, _ := os.ReadFile(p.LogPath)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// Stop shuts the postmaster down fast (SIGINT: its shutdown checkpoint
// writes every dirty page) and waits; SIGKILL after a minute. Stopping a
// stopped Proc does nothing.
func (p *Proc) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	p.cmd = nil
}

// Crash kills the postmaster and every process it forked with SIGKILL, as
// a machine crash would. Each Postgres child is its own process group
// (setsid in InitPostmasterChild), so they are found by parent PID.
func (p *Proc) Crash() {
	if p.cmd == nil {
		return
	}
	kids := Children(p.cmd.Process.Pid)
	seg, _ := pgshm.Of(p.cmd.Process.Pid)
	_ = p.cmd.Process.Kill()
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	<-p.done
	releaseShm(seg)
	p.cmd = nil
}

// Children returns the PIDs whose parent is pid.
func Children(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, err := procfs.ReadStat(n); err == nil && st.PPID == pid {
			out = append(out, n)
		}
	}
	return out
}

// Run runs a PostgreSQL program (psql, pgbench, pg_amcheck, ...) against
// the server as postgres and returns its output; a failure fails the test.
func (p *Proc) Run(name string, args ...string) string {
	p.t.Helper()
	cmd, err := Command(name, append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(p.Port), "-U", "postgres"}, args...)...)
	if err != nil {
		p.t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		p.t.Fatalf("%s %v: %v\n%s\n%s", name, args, err, out, p.Tail())
	}
	return string(out)
}

// Exec runs SQL in the postgres database; an error fails the test.
func (p *Proc) Exec(sql string) {
	p.t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.t.Fatal(err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql); err != nil {
		p.t.Fatalf("%s: %v\n%s", sql, err, p.Tail())
	}
}

// Query returns the single text value of a query in the postgres
// database; an error fails the test.
func (p *Proc) Query(sql string) string {
	p.t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, p.URL())
	if err != nil {
		p.t.Fatal(err)
	}
	defer c.Close(ctx)
	var v string
	if err := c.QueryRow(ctx, sql).Scan(&v); err != nil {
		p.t.Fatalf("%s: %v", sql, err)
	}
	return v
}
