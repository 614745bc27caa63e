// Package pgtest starts throwaway PostgreSQL 15 servers for tests: initdb in a
// fresh folder owned by the postgres OS user, a free port on 127.0.0.1, and a
// cleanup that stops exactly the process it started, even when the test fails.
//
// It is for tests and benchmarks only; strata's own Postgres lifecycle lives
// in core/compute.
package pgtest

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/internal/netport"
	"github.com/stratadb/strata/internal/pgshm"
)

// BinDir is where Debian installs the PostgreSQL 15 binaries.
const BinDir = "/usr/lib/postgresql/15/bin"

// OSUser is the unprivileged OS user Postgres runs as.
const OSUser = "postgres"

// Bin returns the path of a PostgreSQL program, such as "pg_waldump".
func Bin(name string) string { return filepath.Join(BinDir, name) }

// Available reports whether PostgreSQL 15 and its OS user are present.
func Available() error {
	if _, err := os.Stat(Bin("postgres")); err != nil {
		return fmt.Errorf("pgtest: PostgreSQL 15 not installed: %w", err)
	}
	if _, err := user.Lookup(OSUser); err != nil {
		return fmt.Errorf("pgtest: OS user %q missing: %w", OSUser, err)
	}
	return nil
}

// Credential returns the process credential of the postgres OS user, for
// exec.Cmd.SysProcAttr, or nil when the caller is not root (then programs run
// as the caller).
func Credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(OSUser)
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Command returns an exec.Cmd for a PostgreSQL program that runs as the
// postgres OS user when the caller is root.
func Command(name string, args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(Bin(name), args...)
	cred, err := Credential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "TZ=UTC")
	return cmd, nil
}

// MkdirOwned creates a fresh temporary folder owned by the postgres OS user
// and returns its path. The test removes it at cleanup.
func MkdirOwned(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := Chown(dir); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return dir
}

// Chown gives path to the postgres OS user (a no-op when not root).
func Chown(path string) error {
	cred, err := Credential()
	if err != nil || cred == nil {
		return err
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// FreePort returns a TCP port on 127.0.0.1 that was free when picked and
// that no earlier call in this process returned.
//
// The ports lie below the kernel's ephemeral range. A port from that range
// can become the local port of an outgoing connection between the pick
// and the server's listen, or while a server is down between two starts
// ("address already in use", seen in CI). And the kernel may hand out one
// ephemeral port twice to a test that picks several before any listens.
// Each process starts its walk at its own offset, and claims the port
// (netport.Claim) until the test ends, so that no other test binary
// running at once is given it.
func FreePort(t testing.TB) int {
	t.Helper()
	return FreePorts(t, 1)
}

// FreePorts is FreePort for n consecutive ports (a `strata up` cluster
// listens on the safekeeper port and the n-1 after it): it returns the
// first, all n claimed until the test ends.
func FreePorts(t testing.TB, n int) int {
	t.Helper()
	givenMu.Lock()
	defer givenMu.Unlock()
	limit := ephemeralStart()
	if nextPort == 0 {
		nextPort = portFloor + os.Getpid()%1500*7
	}
	for tries := 0; tries < limit-portFloor; tries++ {
		if nextPort+n > limit {
			nextPort = portFloor
		}
		base := nextPort
		nextPort++
		if releases, ok := takeAll(base, n); ok {
			for p := base; p < base+n; p++ {
				given[p] = true
			}
			nextPort = base + n
			t.Cleanup(func() {
				for _, r := range releases {
					r()
				}
			})
			return base
		}
	}
	t.Fatalf("pgtest: no %d free consecutive ports between %d and %d", n, portFloor, limit)
	return 0
}

// takeAll takes (netport.Take) ports base..base+n-1 that no earlier call
// returned, or none of them.
func takeAll(base, n int) ([]func(), bool) {
	var releases []func()
	for p := base; p < base+n; p++ {
		var release func()
		ok := !given[p]
		if ok {
			release, ok = netport.Take(p)
		}
		if !ok {
			for _, r := range releases {
				r()
			}
			return nil, false
		}
		releases = append(releases, release)
	}
	return releases, true
}

// FreeAddr is FreePort as a host:port address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// portFloor is the lowest port FreePort returns.
const portFloor = 20000

// ephemeralStart is the first port of the kernel's ephemeral range.
func ephemeralStart() int {
	if lo, _ := netport.EphemeralRange(); lo > portFloor+2000 {
		return lo
	}
	return 32768
}

var (
	givenMu  sync.Mutex
	given    = map[int]bool{} // ports FreePort returned in this process
	nextPort int
)

// Options shape the server that Start creates.
type Options struct {
	// Conf holds postgresql.conf settings, added after strata's test defaults.
	Conf map[string]string
	// HBA replaces the default pg_hba.conf lines (trust on 127.0.0.1 for
	// everything, replication included).
	HBA []string
	// InitDBArgs are extra initdb arguments.
	InitDBArgs []string
	// Password, when set, is given to the bootstrap superuser "postgres"
	// (initdb --pwfile).
	Password string
}

// Server is a running test PostgreSQL.
type Server struct {
	t       testing.TB
	DataDir string
	SockDir string
	Port    int

	mu  sync.Mutex
	cmd *exec.Cmd
	log *os.File
}

// Start runs initdb (or copies its output: TemplatesEnv) and starts a
// server; it stops the server and removes its folders at test cleanup.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("%v", err)
	}
	root := MkdirOwned(t, "strata-pg-")
	s := &Server{t: t, DataDir: filepath.Join(root, "data"), SockDir: root, Port: FreePort(t)}
	args := []string{"-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8", "-A", "trust"}
	args = append(args, opts.InitDBArgs...)
	if err := initData(s.DataDir, args, opts.Password); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	conf := map[string]string{
		"listen_addresses":        "'127.0.0.1'",
		"port":                    strconv.Itoa(s.Port),
		"unix_socket_directories": "'" + s.SockDir + "'",
		"fsync":                   "on",
		"max_wal_senders":         "10",
		"max_replication_slots":   "10",
		"wal_level":               "replica",
		"logging_collector":       "off",
		"log_min_messages":        "warning",
		"shared_buffers":          "128MB",
	}
	for k, v := range opts.Conf {
		conf[k] = v
	}
	keys := make([]string, 0, len(conf))
	for k := range conf {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, conf[k])
	}
	appendFile(t, filepath.Join(s.DataDir, "postgresql.conf"), b.String())
	hba := opts.HBA
	if hba == nil {
		hba = []string{
			"local all all trust",
			"host all all 127.0.0.1/32 trust",
			"host replication all 127.0.0.1/32 trust",
			"local replication all trust",
		}
	}
	if err := os.WriteFile(filepath.Join(s.DataDir, "pg_hba.conf"), []byte(strings.Join(hba, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Chown(filepath.Join(s.DataDir, "pg_hba.conf")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	s.Launch()
	return s
}

func appendFile(t testing.TB, path, text string) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

// Launch starts the postmaster on the existing data folder and waits until
// it accepts connections (crash recovery included, up to two minutes).
func (s *Server) Launch() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		s.t.Fatalf("pgtest: server already running")
	}
	cmd, err := Command("postgres", "-D", s.DataDir)
	if err != nil {
		s.t.Fatal(err)
	}
	logf, err := os.OpenFile(filepath.Join(s.SockDir, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		s.t.Fatalf("pgtest: start postgres: %v", err)
	}
	s.cmd, s.log = cmd, logf
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, s.ConnString("postgres"))
		if err == nil {
			c.Close(ctx)
			return
		}
		if ctx.Err() != nil {
			s.t.Fatalf("pgtest: postgres did not accept connections: %v\n%s", err, s.LogTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ConnString returns a URL for database db as the postgres superuser.
func (s *Server) ConnString(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", s.Port, db)
}

// PID returns the postmaster's process ID, or 0 when it is not running.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Stop shuts the server down fast (SIGINT) and waits for it; it is safe to
// call twice.
func (s *Server) Stop() { s.signal(syscall.SIGINT) }

// Kill9 kills the postmaster with SIGKILL, as a crash would; its backends
// notice and exit on their own.
func (s *Server) Kill9() { s.signal(syscall.SIGKILL) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	var seg pgshm.Segment
	if sig == syscall.SIGKILL {
		seg, _ = pgshm.Of(s.cmd.Process.Pid)
	}
	_ = s.cmd.Process.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	if sig == syscall.SIGKILL {
		waitOrphans(s.DataDir)
		releaseShm(seg)
	}
	s.log.Close()
	s.cmd, s.log = nil, nil
}

// waitOrphans waits (briefly) for the backends of a killed postmaster to go,
// which they do once they notice their parent died; postmaster.pid stays, and
// the next start checks that no process still holds the shared memory.
func waitOrphans(string) {
	time.Sleep(200 * time.Millisecond)
}

// releaseShm removes the shared memory of a killed postmaster (pgshm) once
// its backends have let go of it (ten seconds at most): the test's folder
// goes at cleanup, and with it the only way the next postmaster would find
// it. A zero Segment (none was found before the kill) does nothing.
func releaseShm(seg pgshm.Segment) {
	if seg.ShmID == 0 && seg.PID == 0 {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, busy, err := seg.Release(); err != nil || !busy {
			return
		}
	}
}

// LogTail returns the last few KiB of the server log.
func (s *Server) LogTail() string {
	b, err := os.ReadFile(filepath.Join(s.SockDir, "postgres.log"))
	if err != nil {
		return ""
	}
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return string(b)
}

// Exec runs SQL statements on database db and fails the test on error.
func (s *Server) Exec(db string, sql string, args ...any) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, s.ConnString(db))
	if err != nil {
		s.t.Fatalf("pgtest: connect: %v", err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, sql, args...); err != nil {
		s.t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// QueryString runs a query that returns one text value.
func (s *Server) QueryString(db, sql string, args ...any) string {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, s.ConnString(db))
	if err != nil {
		s.t.Fatalf("pgtest: connect: %v", err)
	}
	defer c.Close(ctx)
	var v string
	if err := c.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		s.t.Fatalf("pgtest: %s: %v", sql, err)
	}
	return v
}

// Pgbench runs pgbench against the server with the given arguments and
// returns its combined output.
func (s *Server) Pgbench(args ...string) (string, error) {
	cmd, err := Command("pgbench", append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.Port), "-U", "postgres"}, args...)...)
	if err != nil {
		return "", err
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("pgtest: pgbench %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// Untar extracts a tar stream (a basebackup) into dir (created when
// missing), every entry and dir itself owned by the postgres OS user,
// folders 0700 and files 0600.
func Untar(t testing.TB, r io.Reader, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := Chown(dir); err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o700)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		default:
			continue
		}
		if err == nil {
			err = Chown(p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// ControlData returns pg_controldata's "Label: value" lines for the data
// directory dir; a warning from it (a CRC that does not match, which it
// reports and goes on) fails the test.
func ControlData(t testing.TB, dir string) map[string]string {
	t.Helper()
	cmd, err := Command("pg_controldata", "-D", dir)
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pg_controldata: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "WARNING") {
		t.Fatalf("pg_controldata warns:\n%s", out)
	}
	m := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			m[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return m
}
