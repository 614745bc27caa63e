package target

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/netport"
)

// DefaultBinDir is where Debian installs PostgreSQL 15.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// stock is a managed PostgreSQL: initdb on local disk in a temporary folder,
// run as an unprivileged OS user; with receivers > 0 (kind stock-sync) it
// also runs pg_receivewal --synchronous receivers r1..rN and requires
// ANY quorum of them for every commit.
type stock struct {
	cfg  Config
	log  zerolog.Logger
	cred *syscall.Credential
	uid  int
	gid  int

	root, data string
	port       int
	pg         *exec.Cmd
	pgExit     chan struct{}
	recv       []*exec.Cmd
	logf       *os.File
	applied    []string
	inited     bool
}

// NewStock returns a managed stock (or stock-sync) target. Nothing runs
// until Start.
func NewStock(cfg Config, log zerolog.Logger) (Target, error) {
	if cfg.BinDir == "" {
		cfg.BinDir = DefaultBinDir
	}
	if cfg.OSUser == "" {
		cfg.OSUser = "postgres"
	}
	if cfg.Kind == "stock-sync" {
		if cfg.Receivers == 0 {
			cfg.Receivers = 3
		}
		if cfg.Quorum == 0 {
			cfg.Quorum = 2
		}
		if cfg.Quorum > cfg.Receivers {
			return nil, fmt.Errorf("target %s: quorum %d > receivers %d", cfg.Name, cfg.Quorum, cfg.Receivers)
		}
	} else {
		cfg.Receivers = 0
	}
	if _, err := os.Stat(filepath.Join(cfg.BinDir, "postgres")); err != nil {
		return nil, fmt.Errorf("target %s: postgres not found in %s: %w", cfg.Name, cfg.BinDir, err)
	}
	s := &stock{cfg: cfg, log: log.With().Str("target", cfg.Name).Logger(), uid: -1, gid: -1}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(cfg.OSUser)
		if err != nil {
			return nil, fmt.Errorf("target %s: OS user: %w", cfg.Name, err)
		}
		s.uid, _ = strconv.Atoi(u.Uid)
		s.gid, _ = strconv.Atoi(u.Gid)
		s.cred = &syscall.Credential{Uid: uint32(s.uid), Gid: uint32(s.gid)}
	}
	return s, nil
}

func (s *stock) Name() string       { return s.cfg.Name }
func (s *stock) Kind() string       { return s.cfg.Kind }
func (s *stock) MetricsURL() string { return s.cfg.MetricsURL }

func (s *stock) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// ProcessParts implements ProcessParts: the postmaster, and the
// receivers of stock-sync.
func (s *stock) ProcessParts() map[string][]int {
	parts := map[string][]int{}
	if s.pg != nil {
		parts["postgres"] = []int{s.pg.Process.Pid}
	}
	for _, r := range s.recv {
		parts["receivers"] = append(parts["receivers"], r.Process.Pid)
	}
	return parts
}

// PIDs is the postmaster, then the receivers (ProcessParts in order).
func (s *stock) PIDs() []int {
	parts := s.ProcessParts()
	return append(parts["postgres"], parts["receivers"]...)
}

func (s *stock) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.cfg.BinDir, name), args...)
	if s.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	}
	cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8", "TZ=UTC")
	return cmd
}

func (s *stock) mkdir(path string) error {
	if err := os.MkdirAll(path, 0o700); err != nil {
		return err
	}
	if s.uid >= 0 {
		return os.Chown(path, s.uid, s.gid)
	}
	return nil
}

func (s *stock) initdb() error {
	root, err := os.MkdirTemp("", "strata-bench-"+s.cfg.Name+"-")
	if err != nil {
		return err
	}
	s.root, s.data = root, filepath.Join(root, "data")
	if err := s.mkdir(root); err != nil {
		return err
	}
	if s.port, err = netport.Block(1); err != nil {
		return err
	}
	out, err := s.command("initdb", "-D", s.data, "-U", "postgres", "-E", "UTF8",
		"--locale=C.UTF-8", "-A", "trust", "--no-sync").CombinedOutput()
	if err != nil {
		return fmt.Errorf("target %s: initdb: %w\n%s", s.cfg.Name, err, out)
	}
	conf := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(s.port),
		"unix_socket_directories": root,
		"logging_collector":       "off",
		"log_min_messages":        "warning",
		"max_connections":         "200",
		"max_wal_senders":         "10",
		"wal_level":               "replica",
	}
	if s.cfg.Receivers > 0 {
		names := make([]string, s.cfg.Receivers)
		for i := range names {
			names[i] = fmt.Sprintf("r%d", i+1)
		}
		conf["synchronous_standby_names"] = fmt.Sprintf("ANY %d (%s)", s.cfg.Quorum, strings.Join(names, ","))
	}
	var b strings.Builder
	b.WriteString("\n# strata bench\n")
	for _, k := range keys(merge(conf, s.cfg.Settings)) {
		v := merge(conf, s.cfg.Settings)[k]
		fmt.Fprintf(&b, "%s = '%s'\n", k, strings.ReplaceAll(v, "'", "''"))
	}
	f, err := os.OpenFile(filepath.Join(s.data, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(b.String())
	f.Close()
	if err != nil {
		return err
	}
	hba := "local all all trust\nhost all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\nlocal replication all trust\n"
	if err := os.WriteFile(filepath.Join(s.data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		return err
	}
	if s.uid >= 0 {
		if err := os.Chown(filepath.Join(s.data, "pg_hba.conf"), s.uid, s.gid); err != nil {
			return err
		}
	}
	for i := 1; i <= s.cfg.Receivers; i++ {
		if err := s.mkdir(filepath.Join(root, fmt.Sprintf("r%d", i))); err != nil {
			return err
		}
	}
	s.inited = true
	return nil
}

// Start runs initdb on first use, then the postmaster and the receivers,
// and waits until Postgres accepts connections and (stock-sync) every
// receiver streams synchronously.
func (s *stock) Start(ctx context.Context) error {
	if s.pg != nil {
		return nil
	}
	if !s.inited {
		if err := s.initdb(); err != nil {
			return err
		}
	}
	logf, err := os.OpenFile(filepath.Join(s.root, "postgres.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	s.logf = logf
	cmd := s.command("postgres", "-D", s.data)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("target %s: start postgres: %w", s.cfg.Name, err)
	}
	s.pg = cmd
	exit := make(chan struct{})
	s.pgExit = exit
	go func() { _ = cmd.Wait(); close(exit) }()
	if err := s.waitReady(ctx); err != nil {
		_ = s.Stop(context.Background())
		return err
	}
	for i := 1; i <= s.cfg.Receivers; i++ {
		name := fmt.Sprintf("r%d", i)
		r := s.command("pg_receivewal", "-D", filepath.Join(s.root, name), "--synchronous", "--no-password",
			"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", s.port, name))
		r.Stdout, r.Stderr = logf, logf
		if err := r.Start(); err != nil {
			_ = s.Stop(context.Background())
			return fmt.Errorf("target %s: start pg_receivewal: %w", s.cfg.Name, err)
		}
		s.recv = append(s.recv, r)
	}
	if s.cfg.Receivers > 0 {
		if err := s.waitReceivers(ctx); err != nil {
			_ = s.Stop(context.Background())
			return err
		}
	}
	s.log.Info().Int("port", s.port).Int("receivers", len(s.recv)).Str("data", s.data).Msg("managed postgres started")
	return nil
}

func (s *stock) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for {
		c, err := pgx.Connect(ctx, s.URL())
		if err == nil {
			c.Close(context.Background())
			return nil
		}
		select {
		case <-s.pgExit:
			return fmt.Errorf("target %s: postgres exited: %s", s.cfg.Name, s.logTail())
		case <-ctx.Done():
			return fmt.Errorf("target %s: postgres not ready: %w: %s", s.cfg.Name, err, s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *stock) waitReceivers(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for {
		var n int
		err := c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication
			WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')`).Scan(&n)
		if err == nil && n >= s.cfg.Receivers {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("target %s: %d of %d receivers streaming synchronously: %s", s.cfg.Name, n, s.cfg.Receivers, s.logTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop stops the receivers and then the postmaster (fast shutdown),
// signalling only the processes this target started.
func (s *stock) Stop(context.Context) error {
	var errs []error
	for _, r := range s.recv {
		_ = r.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = r.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = r.Process.Kill()
			<-done
		}
	}
	s.recv = nil
	if s.pg != nil {
		_ = s.pg.Process.Signal(syscall.SIGINT)
		select {
		case <-s.pgExit:
		case <-time.After(60 * time.Second):
			_ = s.pg.Process.Kill()
			<-s.pgExit
			errs = append(errs, fmt.Errorf("target %s: postgres killed after 60s", s.cfg.Name))
		}
		s.pg = nil
	}
	if s.logf != nil {
		s.logf.Close()
		s.logf = nil
	}
	return errors.Join(errs...)
}

// Apply sets settings with ALTER SYSTEM and restarts when a postmaster
// setting changed.
func (s *stock) Apply(ctx context.Context, settings map[string]string) (bool, error) {
	if err := s.Start(ctx); err != nil {
		return false, err
	}
	need, err := applySettings(ctx, s.URL(), settings, s.applied)
	if err != nil {
		return false, err
	}
	s.applied = keys(settings)
	if !need {
		time.Sleep(200 * time.Millisecond) // let the postmaster process SIGHUP
		return false, nil
	}
	s.log.Info().Interface("settings", settings).Msg("restarting to apply settings")
	if err := s.Stop(ctx); err != nil {
		return false, err
	}
	return true, s.Start(ctx)
}

// Close stops the target and removes its folder.
func (s *stock) Close() error {
	err := s.Stop(context.Background())
	if s.root != "" {
		if rerr := os.RemoveAll(s.root); rerr != nil {
			err = errors.Join(err, rerr)
		}
	}
	return err
}

func (s *stock) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.root, "postgres.log"))
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return string(b)
}

// WALDir is the server's pg_wal folder (for pg_waldump).
func (s *stock) WALDir() string { return filepath.Join(s.data, "pg_wal") }

// BinDir is the PostgreSQL programs' folder.
func (s *stock) BinDir() string { return s.cfg.BinDir }
