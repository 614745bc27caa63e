package target

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/netport"
)

// strataTarget is a whole strata cluster on this machine, started with
// `strata up` from a config file (the profile) and stopped with `strata
// down`. Its state lives in a temporary folder that Close removes: the
// profile's cluster.data_dir, object store root (fs) and ports are
// overridden through STRATA_* environment variables, so a bench never
// touches a cluster the user runs from the same config.
type strataTarget struct {
	cfg Config
	log zerolog.Logger
	bin string

	root    string
	env     []string
	url     string
	running bool
	applied []string
}

// NewStrata returns a target for a strata profile. cfg.Profile is the
// path of a strata config file (configs/local.yaml is the embedded
// default); cfg.Strata the strata binary (default: this program).
func NewStrata(cfg Config, log zerolog.Logger) (Target, error) {
	if cfg.Profile == "" {
		return nil, fmt.Errorf("target %s: kind strata needs profile (a strata config file such as configs/local.yaml)", cfg.Name)
	}
	if _, err := os.Stat(cfg.Profile); err != nil {
		return nil, fmt.Errorf("target %s: profile: %w", cfg.Name, err)
	}
	if err := CheckConfig(cfg); err != nil {
		return nil, err
	}
	if len(cfg.Config) > 0 {
		if err := checkProfile(cfg); err != nil {
			return nil, fmt.Errorf("target %s: %w", cfg.Name, err)
		}
	}
	if cfg.BinDir == "" {
		cfg.BinDir = DefaultBinDir
	}
	bin := cfg.Strata
	if bin == "" {
		self, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("target %s: %w", cfg.Name, err)
		}
		bin = self
	}
	return &strataTarget{cfg: cfg, log: log.With().Str("target", cfg.Name).Logger(), bin: bin}, nil
}

func (s *strataTarget) Name() string       { return s.cfg.Name }
func (s *strataTarget) Kind() string       { return "strata" }
func (s *strataTarget) URL() string        { return s.url }
func (s *strataTarget) MetricsURL() string { return s.cfg.MetricsURL }
func (s *strataTarget) BinDir() string     { return s.cfg.BinDir }

func (s *strataTarget) prepare() error {
	root, err := os.MkdirTemp("", "strata-bench-"+s.cfg.Name+"-")
	if err != nil {
		return err
	}
	// The postgres OS user must reach the folders below.
	if err := os.Chmod(root, 0o755); err != nil {
		os.RemoveAll(root)
		return err
	}
	pgPort, err := netport.Block(1)
	if err != nil {
		os.RemoveAll(root)
		return err
	}
	base, err := netport.Block(20)
	if err != nil {
		os.RemoveAll(root)
		return err
	}
	s.root = root
	// The target's config keys first, the bench's own folders and ports
	// last (CheckConfig keeps the config from naming those).
	s.env = append(append(os.Environ(), configEnv(s.cfg.Config)...),
		"STRATA_CLUSTER_DATA_DIR="+filepath.Join(root, "cluster"),
		"STRATA_OBJECTSTORE_FS_ROOT="+filepath.Join(root, "objects"),
		"STRATA_COMPUTE_PORT="+strconv.Itoa(pgPort),
		"STRATA_CLUSTER_SAFEKEEPER_PORT="+strconv.Itoa(base),
		"STRATA_CLUSTER_METRICS_PORT="+strconv.Itoa(base+10),
	)
	return nil
}

// strata runs one strata sub-command with the target's config and
// environment, logging its progress lines, and returns its standard output.
func (s *strataTarget) strata(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.bin, append(args, "--config", s.cfg.Profile)...)
	cmd.Env = s.env
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	err := cmd.Run()
	sc := bufio.NewScanner(&errb)
	var last []string
	for sc.Scan() {
		s.log.Debug().Str("cmd", args[0]).Msg(sc.Text())
		last = append(last, sc.Text())
		if len(last) > 8 {
			last = last[1:]
		}
	}
	if err != nil {
		return "", fmt.Errorf("target %s: strata %s: %w: %s", s.cfg.Name, strings.Join(args, " "), err, strings.Join(last, " | "))
	}
	return out.String(), nil
}

func (s *strataTarget) Start(ctx context.Context) error {
	if s.running {
		return nil
	}
	if s.root == "" {
		if err := s.prepare(); err != nil {
			return fmt.Errorf("target %s: %w", s.cfg.Name, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	out, err := s.strata(ctx, "up")
	if err != nil {
		// `strata up` stops what it started when it fails part way; make
		// sure with a down, ignoring its error.
		s.strata(context.Background(), "down")
		return err
	}
	url := ""
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "postgres://") || strings.HasPrefix(line, "postgresql://") {
			url = strings.TrimSpace(line)
		}
	}
	if url == "" {
		s.strata(context.Background(), "down")
		return fmt.Errorf("target %s: strata up printed no connection string (output %q)", s.cfg.Name, out)
	}
	s.url, s.running = url, true
	s.log.Info().Str("data", s.root).Msg("strata cluster started")
	return nil
}

func (s *strataTarget) Stop(ctx context.Context) error {
	if !s.running {
		return nil
	}
	// strata down bounds each process itself (the compute by the time
	// its stop goes without progress, as its shutdown checkpoint takes
	// as long as shared_buffers holds dirty pages), and a compute that
	// does not stop is killed and unmounted by strata down rather than
	// strata down by us (which would leave the cluster running): this
	// is only a backstop, far past any of those bounds.
	limit := time.Hour
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	if _, err := s.strata(ctx, "down"); err != nil {
		return err
	}
	s.running = false
	return nil
}

func (s *strataTarget) Apply(ctx context.Context, settings map[string]string) (bool, error) {
	if !s.running {
		return false, fmt.Errorf("target %s: apply settings: not started", s.cfg.Name)
	}
	all := merge(s.cfg.Settings, settings)
	need, err := applySettings(ctx, s.url, all, s.applied)
	if err != nil {
		return false, err
	}
	s.applied = keys(all)
	if !need {
		return false, nil
	}
	if err := s.Stop(ctx); err != nil {
		return false, err
	}
	if err := s.Start(ctx); err != nil {
		return false, err
	}
	return true, nil
}

// state reads the cluster.json that `strata up` wrote.
func (s *strataTarget) state() (map[string]any, error) {
	b, err := os.ReadFile(filepath.Join(s.root, "cluster", "cluster.json"))
	if err != nil {
		return nil, err
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, err
	}
	return st, nil
}

// PIDs lists every process of the cluster (safekeepers, pageserver,
// compute agent) and the postmaster.
func (s *strataTarget) PIDs() []int {
	var pids []int
	for _, p := range s.ProcessParts() {
		pids = append(pids, p...)
	}
	sort.Ints(pids)
	return pids
}

// ProcessParts implements ProcessParts from the cluster's state: the
// safekeepers, the pageserver, the compute agent and the postmaster (the
// agent's child, a part of its own).
func (s *strataTarget) ProcessParts() map[string][]int {
	if !s.running {
		return nil
	}
	st, err := s.state()
	if err != nil {
		return nil
	}
	parts := map[string][]int{}
	procs, _ := st["procs"].([]any)
	for _, p := range procs {
		m, _ := p.(map[string]any)
		pid, _ := m["pid"].(float64)
		name, _ := m["name"].(string)
		if pid <= 0 {
			continue
		}
		part := name
		switch {
		case strings.HasPrefix(name, "safekeeper"):
			part = "safekeepers"
		case name == "compute":
			part = "agent"
		}
		parts[part] = append(parts[part], int(pid))
	}
	if dir, ok := st["postgres_dir"].(string); ok && dir != "" {
		if b, err := os.ReadFile(filepath.Join(dir, "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(b), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil {
				parts["postgres"] = append(parts["postgres"], pid)
			}
		}
	}
	return parts
}

// MetricsURLs is the metrics_url of the config when it has one, else the
// /metrics endpoints of the cluster's pageserver, compute agent and
// safekeepers (under their IDs: "sk1", ...) as `strata up` started them
// (none when cluster.metrics_port is 0).
func (s *strataTarget) MetricsURLs() map[string]string {
	if s.cfg.MetricsURL != "" {
		return map[string]string{"": s.cfg.MetricsURL}
	}
	out := map[string]string{}
	if !s.running {
		return out
	}
	st, err := s.state()
	if err != nil {
		s.log.Warn().Err(err).Msg("no cluster state: the cluster's metrics are not scraped")
		return out
	}
	procs, _ := st["procs"].([]any)
	for _, p := range procs {
		m, _ := p.(map[string]any)
		name, _ := m["name"].(string)
		if id, ok := strings.CutPrefix(name, "safekeeper "); ok {
			name = id
		} else if name != "pageserver" && name != "compute" {
			continue
		}
		args, _ := m["args"].([]any)
		for i := 0; i+1 < len(args); i++ {
			if a, _ := args[i].(string); a == "--metrics-addr" {
				if addr, _ := args[i+1].(string); addr != "" {
					out[name] = "http://" + addr + "/metrics"
				}
			}
		}
	}
	return out
}

// WALDir is the compute's pg_wal, for pg_waldump.
func (s *strataTarget) WALDir() string {
	st, err := s.state()
	if err != nil {
		return ""
	}
	dir, _ := st["postgres_dir"].(string)
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, "pg_wal")
}

func (s *strataTarget) Close() error {
	err := s.Stop(context.Background())
	if s.root != "" {
		if rerr := os.RemoveAll(s.root); err == nil {
			err = rerr
		}
		s.root = ""
	}
	return err
}

var (
	_ Target         = (*strataTarget)(nil)
	_ WALSource      = (*strataTarget)(nil)
	_ MetricsSources = (*strataTarget)(nil)
)
