// Package postgres runs a stock PostgreSQL 15 server for strata: initdb,
// strata's settings, start and stop through pg_ctl as an unprivileged OS user
// (Postgres refuses to run as root), and waiting until it accepts
// connections. The server outlives the strata process that started it, so
// that `strata up` can return; it is stopped by its data directory.
//
// It is not a client library and knows nothing of safekeepers or FUSE: the
// callers decide the settings.
package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// DefaultBinDir is where Debian installs PostgreSQL 15.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// ConfFile is the file, included from postgresql.conf, that holds the
// settings strata manages; Configure rewrites it whole.
const ConfFile = "strata.conf"

// ErrNotInitialized is returned when the data directory has no cluster.
var ErrNotInitialized = errors.New("postgres: data directory not initialized")

// Server is one PostgreSQL data directory and how to run it.
type Server struct {
	BinDir  string // PostgreSQL programs; DefaultBinDir when empty
	DataDir string // absolute path of PGDATA
	OSUser  string // OS user to run as when strata runs as root
	Port    int
	// SocketDir is where the Unix socket goes (default: "sock" beside
	// DataDir, created and given to the OS user).
	SocketDir string
	// LogPath is the server log (default: postgres.log beside DataDir).
	LogPath string
	// NoSync runs initdb with --no-sync: nothing is fsynced (on a strata
	// FUSE data directory the pages become durable once the safekeepers'
	// commit LSN passes their WAL position, and an fsync would wait for
	// safekeepers that cannot stream before Postgres runs).
	NoSync bool
	// WALDir, when set, is where initdb puts pg_wal (-X): pg_wal becomes
	// a symbolic link to it.
	WALDir string
	Log    zerolog.Logger
}

func (s *Server) bin(name string) string {
	dir := s.BinDir
	if dir == "" {
		dir = DefaultBinDir
	}
	return filepath.Join(dir, name)
}

func (s *Server) socketDir() string {
	if s.SocketDir != "" {
		return s.SocketDir
	}
	return filepath.Join(filepath.Dir(s.DataDir), "sock")
}

// credential returns the OS user's uid/gid when running as root.
func (s *Server) credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	name := s.OSUser
	if name == "" {
		name = "postgres"
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("postgres: strata runs as root and Postgres refuses to; the OS user %q to run it as is missing (create it, e.g. `useradd --system postgres`): %w", name, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Command builds an invocation of the PostgreSQL program name (from
// BinDir) that runs as the OS user when strata runs as root, in its own
// session.
func (s *Server) Command(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	return s.command(ctx, name, args...)
}

// Credential returns the OS user's uid and gid when strata runs as root,
// nil otherwise.
func (s *Server) Credential() (*syscall.Credential, error) { return s.credential() }

// command builds a PostgreSQL program invocation as the OS user.
func (s *Server) command(ctx context.Context, name string, args ...string) (*exec.Cmd, error) {
	cmd := exec.CommandContext(ctx, s.bin(name), args...)
	cred, err := s.credential()
	if err != nil {
		return nil, err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setsid: true}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
	return cmd, nil
}

// Chown gives path to the OS user (no-op when not root).
func (s *Server) Chown(path string) error {
	cred, err := s.credential()
	if err != nil || cred == nil {
		return err
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// CheckReachable fails with a clear message when the OS user cannot reach
// DataDir.
func (s *Server) CheckReachable() error { return s.checkReachable(s.DataDir) }

// checkReachable fails with a clear message when the OS user cannot reach
// dir (a parent folder without search permission for others, such as /root).
func (s *Server) checkReachable(dir string) error {
	if os.Geteuid() != 0 {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err == nil && st.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("postgres: the OS user %q cannot reach %s because %s is not searchable by others (mode %v); use a folder under one that is (for cluster.data_dir or strata restore's --to: e.g. under /var/lib) or `chmod o+x %s`", s.osUser(), dir, d, st.Mode().Perm(), d)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

func (s *Server) osUser() string {
	if s.OSUser == "" {
		return "postgres"
	}
	return s.OSUser
}

// Initialized reports whether DataDir holds a cluster.
func (s *Server) Initialized() bool {
	_, err := os.Stat(filepath.Join(s.DataDir, "PG_VERSION"))
	return err == nil
}

// InitDB creates the cluster with superuser "postgres" and the given
// password (scram-sha-256 over TCP; trust only on the Unix socket, which
// only the OS user can reach).
func (s *Server) InitDB(ctx context.Context, password string) error {
	if !filepath.IsAbs(s.DataDir) {
		return fmt.Errorf("postgres: data directory %q must be absolute", s.DataDir)
	}
	if err := s.checkReachable(s.DataDir); err != nil {
		return err
	}
	parent := filepath.Dir(s.LogFile())
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	pw := filepath.Join(parent, ".initdb-pw")
	if err := os.WriteFile(pw, []byte(password+"\n"), 0o600); err != nil {
		return err
	}
	defer os.Remove(pw)
	if err := s.Chown(pw); err != nil {
		return err
	}
	if err := os.MkdirAll(s.DataDir, 0o700); err != nil {
		return err
	}
	if err := s.Chown(s.DataDir); err != nil {
		return err
	}
	args := []string{"-D", s.DataDir, "-U", "postgres", "--pwfile", pw,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"}
	if s.NoSync {
		args = append(args, "--no-sync")
	}
	if s.WALDir != "" {
		args = append(args, "-X", s.WALDir)
	}
	cmd, err := s.command(ctx, "initdb", args...)
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("postgres: initdb %s: %v\n%s", s.DataDir, err, out)
	}
	if err := s.writeOwned(filepath.Join(s.DataDir, "pg_hba.conf"), hba); err != nil {
		return err
	}
	return s.includeConf()
}

// hba is strata's pg_hba.conf: trust on the Unix socket, which only the
// OS user reaches; passwords over TCP.
const hba = "local all all trust\n" +
	"local replication all trust\n" +
	"host all all 127.0.0.1/32 scram-sha-256\n" +
	"host replication all 127.0.0.1/32 scram-sha-256\n"

// includeLine is what postgresql.conf gets so that strata.conf applies.
var includeLine = fmt.Sprintf("include_if_exists = '%s'", ConfFile)

func (s *Server) includeConf() error {
	f, err := os.OpenFile(filepath.Join(s.DataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "\n# Settings managed by strata.\n%s\n", includeLine)
	return err
}

// Adopt makes a data directory that strata did not initdb (an imported
// one) take strata's settings as one it made does: strata's pg_hba.conf
// (the folder's own is kept as pg_hba.conf.imported) and the include of
// strata.conf at the end of postgresql.conf, unless its last line is
// that include already.
func (s *Server) Adopt() error {
	path := filepath.Join(s.DataDir, "pg_hba.conf")
	if old, err := os.ReadFile(path); err == nil && string(old) != hba {
		if err := s.writeOwned(path+".imported", string(old)); err != nil {
			return err
		}
	}
	if err := s.writeOwned(path, hba); err != nil {
		return err
	}
	conf, err := os.ReadFile(filepath.Join(s.DataDir, "postgresql.conf"))
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(conf)), "\n")
	if strings.TrimSpace(lines[len(lines)-1]) == includeLine {
		return nil
	}
	return s.includeConf()
}

func (s *Server) writeOwned(path, text string) error {
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return err
	}
	return s.Chown(path)
}

// Configure writes the strata-managed settings (name -> value as written in
// postgresql.conf, strings already quoted), replacing earlier ones. Port,
// listen address and socket directory are added from the Server.
func (s *Server) Configure(settings map[string]string) error {
	if !s.Initialized() {
		return fmt.Errorf("%w: %s", ErrNotInitialized, s.DataDir)
	}
	if err := os.MkdirAll(s.socketDir(), 0o755); err != nil {
		return err
	}
	if err := s.Chown(s.socketDir()); err != nil {
		return err
	}
	all := map[string]string{
		"port":                    strconv.Itoa(s.Port),
		"listen_addresses":        "'127.0.0.1'",
		"unix_socket_directories": "'" + s.socketDir() + "'",
	}
	for k, v := range settings {
		all[k] = v
	}
	keys := make([]string, 0, len(all))
	for k := range all {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	b.WriteString("# Written by strata; edits are overwritten at the next start.\n")
	for _, k := range keys {
		fmt.Fprintf(&b, "%s = %s\n", k, all[k])
	}
	return s.writeOwned(filepath.Join(s.DataDir, ConfFile), b.String())
}

// LogFile is where the server's log goes.
func (s *Server) LogFile() string {
	if s.LogPath != "" {
		return s.LogPath
	}
	return filepath.Join(filepath.Dir(s.DataDir), "postgres.log")
}

// Tail returns the last n bytes of the server log.
func (s *Server) Tail(n int) string { return tail(s.LogFile(), n) }

// Start starts the server in the background (it survives this process) and
// waits until it accepts connections, crash recovery included, or ctx ends.
func (s *Server) Start(ctx context.Context, password string) error {
	if !s.Initialized() {
		return fmt.Errorf("%w: %s", ErrNotInitialized, s.DataDir)
	}
	logf, err := os.OpenFile(s.LogFile(), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	logf.Close()
	if err := s.Chown(s.LogFile()); err != nil {
		return err
	}
	cmd, err := s.command(ctx, "pg_ctl", "start", "-D", s.DataDir, "-l", s.LogFile(), "-W", "-s")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("postgres: pg_ctl start: %v: %s\n%s", err, bytes.TrimSpace(out), tail(s.LogFile(), 2048))
	}
	s.Log.Info().Str("data_dir", s.DataDir).Int("port", s.Port).Msg("postgres starting")
	return s.WaitReady(ctx, password)
}

// WaitReady waits until the server accepts a connection.
func (s *Server) WaitReady(ctx context.Context, password string) error {
	last := time.Now()
	for {
		c, err := pgx.Connect(ctx, s.URL(password, "postgres"))
		if err == nil {
			c.Close(ctx)
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("postgres: not accepting connections on port %d: %v\n%s", s.Port, err, tail(s.LogFile(), 2048))
		}
		if pid, _ := s.PID(); pid == 0 && time.Since(last) > 3*time.Second {
			return fmt.Errorf("postgres: server exited during start:\n%s", tail(s.LogFile(), 4096))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// URL returns a postgres:// connection string for db as superuser postgres.
func (s *Server) URL(password, db string) string {
	return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/%s?sslmode=disable", password, s.Port, db)
}

// PID returns the postmaster's PID from postmaster.pid when that process
// is alive, else 0.
func (s *Server) PID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.DataDir, "postmaster.pid"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		return 0, nil
	}
	if syscall.Kill(pid, 0) != nil {
		return 0, nil
	}
	return pid, nil
}

// Stop shuts the server down (fast mode: open transactions roll back) and
// waits for it to exit. A server that is not running is not an error.
func (s *Server) Stop(ctx context.Context) error {
	if pid, _ := s.PID(); pid == 0 {
		return nil
	}
	cmd, err := s.command(ctx, "pg_ctl", "stop", "-D", s.DataDir, "-m", "fast", "-w", "-t", "120", "-s")
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("postgres: pg_ctl stop: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
