package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/postgres"
)

// ReplUser is the replication role the safekeepers stream WAL as.
const ReplUser = "strata_repl"

// ErrNotRunning is returned by Status when no cluster was started here.
var ErrNotRunning = errors.New("cluster: not running (start it with `strata up`)")

// State is what `strata up` started, kept in <data_dir>/cluster.json.
type State struct {
	DataDir     string `json:"data_dir"`
	ConfigPath  string `json:"config_path"`
	PostgresDir string `json:"postgres_dir"`
	Port        int    `json:"port"`
	Procs       []Proc `json:"procs"`
	Started     string `json:"started"`
}

// Cluster is the single-machine cluster that cfg describes.
type Cluster struct {
	cfg     *config.Config
	dataDir string
	strata  string // path of the strata binary that runs the safekeepers
	log     zerolog.Logger
}

// New returns the cluster of cfg. strataBin is the binary to run the
// safekeepers with (normally os.Executable()).
func New(cfg *config.Config, strataBin string, log zerolog.Logger) (*Cluster, error) {
	dir, err := filepath.Abs(cfg.Cluster.DataDir)
	if err != nil {
		return nil, err
	}
	return &Cluster{cfg: cfg, dataDir: dir, strata: strataBin, log: log}, nil
}

func (c *Cluster) statePath() string { return filepath.Join(c.dataDir, "cluster.json") }

func (c *Cluster) postgres() *postgres.Server {
	return &postgres.Server{
		BinDir:  c.cfg.Compute.PGBinDir,
		DataDir: filepath.Join(c.dataDir, "compute", "pgdata"),
		OSUser:  c.cfg.Compute.OSUser,
		Port:    c.cfg.Compute.Port,
		Log:     c.log,
	}
}

// readState returns the recorded state, or ErrNotRunning.
func (c *Cluster) readState() (*State, error) {
	b, err := os.ReadFile(c.statePath())
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNotRunning
	}
	if err != nil {
		return nil, err
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("cluster: %s: %w", c.statePath(), err)
	}
	return &st, nil
}

func (c *Cluster) writeState(st *State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := c.statePath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, c.statePath())
}

// secret returns the named secret under <data_dir>/secrets, creating a
// random one the first time. Secrets are never logged.
func (c *Cluster) secret(name string) (string, error) {
	dir := filepath.Join(c.dataDir, "secrets")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if b, err := os.ReadFile(p); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	buf := make([]byte, 16)
	if _, err := rand.Read(buf); err != nil {
		return "", err
	}
	s := hex.EncodeToString(buf)
	if err := os.WriteFile(p, []byte(s+"\n"), 0o600); err != nil {
		return "", err
	}
	return s, nil
}

// URL is the connection string of the cluster's Postgres.
func (c *Cluster) URL() (string, error) {
	pw, err := c.secret("postgres.password")
	if err != nil {
		return "", err
	}
	return c.postgres().URL(pw, "postgres"), nil
}

func (c *Cluster) safekeeperIDs() []string {
	ids := make([]string, c.cfg.Cluster.Safekeepers)
	for i := range ids {
		ids[i] = fmt.Sprintf("sk%d", i+1)
	}
	return ids
}

func (c *Cluster) safekeeperAddr(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.Cluster.SafekeeperPort+i))
}

// syncStandbyNames is the synchronous_standby_names value: ANY quorum of
// the safekeepers.
func (c *Cluster) syncStandbyNames() string {
	return fmt.Sprintf("ANY %d (%s)", c.cfg.Cluster.Quorum, strings.Join(c.safekeeperIDs(), ", "))
}

// Running reports whether every recorded process is alive.
func (c *Cluster) Running() (*State, bool) {
	st, err := c.readState()
	if err != nil {
		return nil, false
	}
	for _, p := range st.Procs {
		if !p.Alive() {
			return st, false
		}
	}
	if pid, _ := c.postgres().PID(); pid == 0 {
		return st, false
	}
	return st, true
}

// Up starts whatever of the cluster is not running, waits until Postgres
// accepts connections and a quorum of safekeepers streams from it, and
// returns the connection string. progress gets one line per step.
func (c *Cluster) Up(ctx context.Context, progress func(string)) (string, error) {
	if st, ok := c.Running(); ok {
		progress("cluster already running (started " + st.Started + ")")
		return c.URL()
	}
	// A half-running cluster (some process died) is stopped first, so
	// that we start from a known state.
	if st, err := c.readState(); err == nil {
		progress("restarting a partly running cluster")
		c.stopProcs(ctx, st)
	}
	if err := os.MkdirAll(c.dataDir, 0o755); err != nil {
		return "", err
	}
	if err := c.checkPorts(); err != nil {
		return "", err
	}
	pgPW, err := c.secret("postgres.password")
	if err != nil {
		return "", err
	}
	replPW, err := c.secret("replication.password")
	if err != nil {
		return "", err
	}
	pg := c.postgres()
	if !pg.Initialized() {
		progress("initdb " + pg.DataDir)
		if err := os.MkdirAll(filepath.Dir(pg.DataDir), 0o755); err != nil {
			return "", err
		}
		if err := pg.InitDB(ctx, pgPW); err != nil {
			return "", err
		}
	}
	settings := map[string]string{
		"wal_level":                 "replica",
		"max_wal_senders":           "16",
		"max_replication_slots":     "16",
		"wal_sender_timeout":        "'30s'",
		"synchronous_commit":        "on",
		"synchronous_standby_names": "'" + c.syncStandbyNames() + "'",
		"full_page_writes":          onOff(c.cfg.Compute.FullPageWrites),
		"shared_buffers":            "'" + c.cfg.Compute.SharedBuffers + "'",
	}
	for k, v := range c.cfg.Compute.Settings {
		settings[k] = v
	}
	if err := pg.Configure(settings); err != nil {
		return "", err
	}
	st := &State{
		DataDir:     c.dataDir,
		ConfigPath:  c.cfg.Path,
		PostgresDir: pg.DataDir,
		Port:        pg.Port,
		Started:     time.Now().UTC().Format(time.RFC3339),
	}
	progress(fmt.Sprintf("postgres on 127.0.0.1:%d (synchronous_standby_names = '%s')", pg.Port, c.syncStandbyNames()))
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := pg.Start(startCtx, pgPW); err != nil {
		return "", err
	}
	if err := c.ensureReplUser(startCtx, pg, pgPW, replPW); err != nil {
		c.stopProcs(ctx, st)
		return "", err
	}
	for i, id := range c.safekeeperIDs() {
		p, err := c.startSafekeeper(i, id, replPW)
		if err != nil {
			c.stopProcs(ctx, st)
			return "", err
		}
		st.Procs = append(st.Procs, p)
		progress(fmt.Sprintf("safekeeper %s on %s (pid %d, log %s)", id, c.safekeeperAddr(i), p.PID, p.Log))
	}
	if err := c.writeState(st); err != nil {
		c.stopProcs(ctx, st)
		return "", err
	}
	progress(fmt.Sprintf("waiting for %d of %d safekeepers to stream", c.cfg.Cluster.Quorum, c.cfg.Cluster.Safekeepers))
	if err := c.waitQuorum(startCtx, pg, pgPW, st); err != nil {
		return "", err
	}
	return pg.URL(pgPW, "postgres"), nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// checkPorts fails early, naming the key to change, when a port is taken.
func (c *Cluster) checkPorts() error {
	check := func(key string, port int) error {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return fmt.Errorf("cluster: port %d on 127.0.0.1 is in use (%s): stop what uses it or change %s", port, err, key)
		}
		return l.Close()
	}
	if err := check("compute.port", c.cfg.Compute.Port); err != nil {
		return err
	}
	for i := range c.safekeeperIDs() {
		if err := check("cluster.safekeeper_port", c.cfg.Cluster.SafekeeperPort+i); err != nil {
			return err
		}
	}
	return nil
}

// ensureReplUser creates or updates the replication role. The session
// commits locally: no safekeeper streams yet, so a synchronous commit
// would wait for ever.
func (c *Cluster) ensureReplUser(ctx context.Context, pg *postgres.Server, pgPW, replPW string) error {
	conn, err := pgx.Connect(ctx, pg.URL(pgPW, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "SET synchronous_commit = local"); err != nil {
		return err
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)", ReplUser).Scan(&exists); err != nil {
		return err
	}
	verb := "CREATE"
	if exists {
		verb = "ALTER"
	}
	// Identifiers and the password are ours (hex), so plain formatting is safe.
	_, err = conn.Exec(ctx, fmt.Sprintf("%s ROLE %s LOGIN REPLICATION PASSWORD '%s'", verb, ReplUser, replPW))
	return err
}

func (c *Cluster) startSafekeeper(i int, id, replPW string) (Proc, error) {
	dir := filepath.Join(c.dataDir, "safekeepers", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Proc{}, err
	}
	var peers []string
	for j := range c.safekeeperIDs() {
		if j != i {
			peers = append(peers, c.safekeeperAddr(j))
		}
	}
	args := []string{"safekeeper",
		"--id", id,
		"--data-dir", dir,
		"--listen", c.safekeeperAddr(i),
		"--peers", strings.Join(peers, ","),
		// Every safekeeper archives to the cluster's object store under
		// the same prefix: archive keys are content-addressed by segment,
		// and a segment's bytes are the same on every safekeeper.
		"--archive",
	}
	if c.cfg.Cluster.MetricsPort > 0 {
		args = append(args, "--metrics-addr", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.cfg.Cluster.MetricsPort+i)))
	}
	if c.cfg.Path != "" {
		args = append([]string{"--config", c.cfg.Path}, args...)
	}
	// The replication password travels in the environment, not in argv
	// (which any user can read in /proc).
	env := []string{"STRATA_SAFEKEEPER_POSTGRES=" + fmt.Sprintf("postgres://%s:%s@127.0.0.1:%d/postgres?sslmode=disable", ReplUser, replPW, c.cfg.Compute.Port)}
	return startDetached("safekeeper "+id, c.strata, args, filepath.Join(dir, "safekeeper.log"), env)
}

// waitQuorum waits until enough safekeepers stream from Postgres for a
// synchronous commit to return.
func (c *Cluster) waitQuorum(ctx context.Context, pg *postgres.Server, pgPW string, st *State) error {
	conn, err := pgx.Connect(ctx, pg.URL(pgPW, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	for {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('quorum', 'sync')").Scan(&n)
		if err == nil && n >= c.cfg.Cluster.Quorum {
			return nil
		}
		for _, p := range st.Procs {
			if !p.Alive() {
				return fmt.Errorf("cluster: %s exited; its log %s ends with:\n%s", p.Name, p.Log, tail(p.Log, 2048))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster: only %d of the %d safekeepers needed are streaming from Postgres: %w (see the logs under %s/safekeepers)", n, c.cfg.Cluster.Quorum, ctx.Err(), c.dataDir)
		case <-time.After(200 * time.Millisecond):
		}
	}
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

// Down stops Postgres (fast shutdown), then the safekeepers, and removes
// the state file. The data stays.
func (c *Cluster) Down(ctx context.Context, progress func(string)) error {
	st, err := c.readState()
	if errors.Is(err, ErrNotRunning) {
		if pid, _ := c.postgres().PID(); pid == 0 {
			progress("not running")
			return nil
		}
		st = &State{}
	} else if err != nil {
		return err
	}
	err = c.stopProcs(ctx, st)
	if rmErr := os.Remove(c.statePath()); rmErr != nil && !errors.Is(rmErr, os.ErrNotExist) && err == nil {
		err = rmErr
	}
	if err == nil {
		progress("stopped")
	}
	return err
}

func (c *Cluster) stopProcs(ctx context.Context, st *State) error {
	var errs []error
	if err := c.postgres().Stop(ctx); err != nil {
		errs = append(errs, err)
	}
	for _, p := range st.Procs {
		if err := p.Stop(30 * time.Second); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
