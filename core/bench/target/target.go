// Package target gives strata bench the Postgres endpoints it drives: a
// plain URL, or a managed server the bench starts and stops itself ("stock":
// initdb + postgres in a temporary folder; "stock-sync": the same with three
// pg_receivewal --synchronous receivers and synchronous_standby_names =
// 'ANY 2 (r1,r2,r3)'); "strata": a whole strata cluster started with
// `strata up` from a config file (the profile) in a temporary folder).
//
// It is not a general Postgres manager: strata's own Postgres lifecycle
// lives in core/compute.
package target

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// ErrNeedsRestart is returned when a URL target is asked to change a
// setting that only a restart applies.
var ErrNeedsRestart = errors.New("target: setting needs a restart, which this target cannot do")

// Config describes one target in a bench matrix.
type Config struct {
	Name string `yaml:"name"`
	// Kind is "url", "stock", "stock-sync" or "strata".
	Kind string `yaml:"kind"`
	// URL is the connection string (kind url), pointing at a database that
	// exists (usually postgres).
	URL string `yaml:"url"`
	// Settings are postgresql.conf settings applied at start (managed
	// kinds) or with ALTER SYSTEM (url).
	Settings map[string]string `yaml:"settings"`
	// MetricsURL, when set, is a Prometheus /metrics endpoint scraped
	// before and after every run (strata's own metrics).
	MetricsURL string `yaml:"metrics_url"`
	// Processes (kind url) are the names of this machine's processes that
	// belong to the server, for the CPU split and settle (default:
	// postgres). A strata cluster started by hand: [postgres, strata].
	Processes []string `yaml:"processes"`
	// BinDir holds the PostgreSQL programs (default /usr/lib/postgresql/15/bin).
	BinDir string `yaml:"bin_dir"`
	// OSUser runs the managed servers (default postgres).
	OSUser string `yaml:"os_user"`
	// Receivers is the number of pg_receivewal receivers (stock-sync, default 3).
	Receivers int `yaml:"receivers"`
	// Quorum is the ANY n of synchronous_standby_names (stock-sync, default 2).
	Quorum int `yaml:"quorum"`
	// Profile is the strata config file the cluster starts from (kind
	// strata), e.g. configs/local.yaml.
	Profile string `yaml:"profile"`
	// Strata is the strata binary (kind strata; default: this program).
	Strata string `yaml:"strata"`
	// Config holds strata config keys for this target only (kind strata),
	// dotted as in the config file: storage.image_policy: fpi. They reach
	// `strata up` and `strata down` as STRATA_* environment overrides
	// (STRATA_STORAGE_IMAGE_POLICY) on top of the profile.
	Config map[string]string `yaml:"config"`
}

// Target is one Postgres endpoint. Methods are not safe for concurrent use;
// the runner drives one target at a time.
type Target interface {
	// Name is the configured name.
	Name() string
	// Kind is the configured kind.
	Kind() string
	// Start makes the endpoint accept connections (a no-op when running).
	Start(ctx context.Context) error
	// Stop stops what Start started, keeping its data for the next Start.
	Stop(ctx context.Context) error
	// URL is a connection string to the maintenance database "postgres".
	URL() string
	// Apply makes settings current: reload, or a restart when one of them
	// needs it. Settings applied earlier and absent now are reset.
	Apply(ctx context.Context, settings map[string]string) (restarted bool, err error)
	// PIDs lists the root processes that belong to the target (their
	// descendants too), for CPU accounting; nil when unknown.
	PIDs() []int
	// MetricsURL is the Prometheus endpoint to scrape, or "".
	MetricsURL() string
	// Close stops the target and removes what it created.
	Close() error
}

// ProcessParts is implemented by targets made of several programs: the
// root PIDs of each part (collect.Who.Parts), so that a run records where
// the target's CPU went (cpu_<part>_pct). The part names are those of
// report.CPUParts.
type ProcessParts interface {
	ProcessParts() map[string][]int
}

// ProcessNames is implemented by targets known by name only (kind url):
// the names of their processes on this machine (collect.Who.Names).
type ProcessNames interface {
	ProcessNames() []string
}

// MetricsSources is implemented by targets with Prometheus endpoints of
// their own (a strata cluster: pageserver, compute agent).
type MetricsSources interface {
	// MetricsURLs maps a prefix to a /metrics URL; the bench stores each
	// endpoint's series as strata.<prefix>.<series> ("" prefix:
	// strata.<series>). Empty when there is nothing to scrape.
	MetricsURLs() map[string]string
}

// Factory builds a Target from its Config.
type Factory func(cfg Config, log zerolog.Logger) (Target, error)

// Registry maps target kinds to factories; add a kind by adding a factory.
type Registry map[string]Factory

// DefaultRegistry returns the kinds strata bench knows today.
func DefaultRegistry() Registry {
	return Registry{
		"url":        NewURL,
		"stock":      NewStock,
		"stock-sync": NewStock,
		"strata":     NewStrata,
	}
}

// New builds the target for cfg.
func (r Registry) New(cfg Config, log zerolog.Logger) (Target, error) {
	f, ok := r[cfg.Kind]
	if !ok {
		kinds := make([]string, 0, len(r))
		for k := range r {
			kinds = append(kinds, k)
		}
		sort.Strings(kinds)
		return nil, fmt.Errorf("target %s: unknown kind %q (known: %s)", cfg.Name, cfg.Kind, strings.Join(kinds, ", "))
	}
	return f(cfg, log)
}

// applySettings runs ALTER SYSTEM for settings (and RESET for previously
// applied names not in settings), reloads, and reports whether any
// postmaster-level setting differs from its current value.
func applySettings(ctx context.Context, url string, settings map[string]string, previous []string) (needRestart bool, err error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return false, fmt.Errorf("target: connect: %w", err)
	}
	defer c.Close(context.Background())
	for _, name := range previous {
		if _, ok := settings[name]; !ok {
			if _, err := c.Exec(ctx, "ALTER SYSTEM RESET "+pgx.Identifier{name}.Sanitize()); err != nil {
				return false, fmt.Errorf("target: reset %s: %w", name, err)
			}
		}
	}
	names := make([]string, 0, len(settings))
	for k := range settings {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		v := settings[name]
		q := fmt.Sprintf("ALTER SYSTEM SET %s = '%s'", pgx.Identifier{name}.Sanitize(), strings.ReplaceAll(v, "'", "''"))
		if _, err := c.Exec(ctx, q); err != nil {
			return false, fmt.Errorf("target: set %s: %w", name, err)
		}
		var context, current string
		if err := c.QueryRow(ctx, "SELECT context, current_setting(name) FROM pg_settings WHERE name = $1", name).Scan(&context, &current); err != nil {
			return false, fmt.Errorf("target: read %s: %w", name, err)
		}
		if context == "postmaster" && !sameSetting(current, v) {
			needRestart = true
		}
	}
	if _, err := c.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return false, fmt.Errorf("target: reload: %w", err)
	}
	return needRestart, nil
}

func sameSetting(current, want string) bool {
	norm := func(s string) string { return strings.ToLower(strings.Trim(strings.TrimSpace(s), "'")) }
	a, b := norm(current), norm(want)
	if a == b {
		return true
	}
	bools := map[string]string{"on": "on", "true": "on", "yes": "on", "1": "on", "off": "off", "false": "off", "no": "off", "0": "off"}
	if x, ok := bools[a]; ok {
		return x == bools[b]
	}
	return false
}

// urlTarget is an endpoint the bench does not manage.
type urlTarget struct {
	cfg     Config
	log     zerolog.Logger
	applied []string
}

// NewURL returns a target for an existing server at cfg.URL.
func NewURL(cfg Config, log zerolog.Logger) (Target, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("target %s: kind url needs url", cfg.Name)
	}
	for _, n := range cfg.Processes {
		if n == "" || len(n) > 15 || strings.ContainsAny(n, "/ ") {
			return nil, fmt.Errorf("target %s: processes: %q is not a process name (as in /proc/PID/comm: up to 15 characters)", cfg.Name, n)
		}
	}
	return &urlTarget{cfg: cfg, log: log}, nil
}

func (u *urlTarget) ProcessNames() []string { return u.cfg.Processes }

func (u *urlTarget) Name() string                { return u.cfg.Name }
func (u *urlTarget) Kind() string                { return "url" }
func (u *urlTarget) Start(context.Context) error { return nil }
func (u *urlTarget) Stop(context.Context) error  { return nil }
func (u *urlTarget) URL() string                 { return u.cfg.URL }
func (u *urlTarget) PIDs() []int                 { return nil }
func (u *urlTarget) MetricsURL() string          { return u.cfg.MetricsURL }
func (u *urlTarget) Close() error                { return nil }

func (u *urlTarget) Apply(ctx context.Context, settings map[string]string) (bool, error) {
	all := merge(u.cfg.Settings, settings)
	need, err := applySettings(ctx, u.cfg.URL, all, u.applied)
	if err != nil {
		return false, err
	}
	u.applied = keys(all)
	if need {
		return false, fmt.Errorf("target %s: %w", u.cfg.Name, ErrNeedsRestart)
	}
	return false, nil
}

func merge(a, b map[string]string) map[string]string {
	m := map[string]string{}
	for k, v := range a {
		m[k] = v
	}
	for k, v := range b {
		m[k] = v
	}
	return m
}

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var (
	_ Target = (*urlTarget)(nil)
	_ Target = (*stock)(nil)
)

// WALSource is implemented by targets whose WAL files the bench can read
// (managed targets), so that pg_waldump can measure full-page-image bytes.
type WALSource interface {
	WALDir() string
	BinDir() string
}

var _ WALSource = (*stock)(nil)
