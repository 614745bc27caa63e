// Package matrix reads a strata bench run matrix from YAML and expands it
// into the runs to make: targets x Postgres settings x virtual users x
// warehouses, each repeated and interleaved (repeat 1 of every
// configuration, then repeat 2, ...), so that slow drift of the machine
// spreads over all configurations instead of biasing one.
package matrix

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/stratadb/strata/core/bench/target"
)

// ErrInvalid wraps every validation error.
var ErrInvalid = errors.New("matrix: invalid")

// Axis is a YAML scalar or list of scalars.
type Axis []string

// UnmarshalYAML accepts "x" or [x, y].
func (a *Axis) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*a = Axis{n.Value}
		return nil
	case yaml.SequenceNode:
		out := make(Axis, 0, len(n.Content))
		for _, c := range n.Content {
			if c.Kind != yaml.ScalarNode {
				return fmt.Errorf("line %d: axis values must be scalars", c.Line)
			}
			out = append(out, c.Value)
		}
		*a = out
		return nil
	}
	return fmt.Errorf("line %d: want a value or a list", n.Line)
}

// Pgbench holds the pgbench workload's knobs.
type Pgbench struct {
	Scale int `yaml:"scale"`
	// Mode is pgbench's --protocol: simple, extended or prepared.
	Mode string `yaml:"mode"`
	// Builtin is pgbench's --builtin script (tpcb-like, simple-update,
	// select-only).
	Builtin string `yaml:"builtin"`
	Threads int    `yaml:"threads"`
}

// Matrix is one YAML file.
type Matrix struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Workload is "tpcc" (default) or "pgbench".
	Workload string          `yaml:"workload"`
	Targets  []target.Config `yaml:"targets"`
	// Settings are Postgres settings; a list is an axis.
	Settings map[string]Axis `yaml:"settings"`
	// VirtualUsers is the axis of concurrent sessions (pgbench clients).
	VirtualUsers Axis   `yaml:"virtual_users"`
	Warehouses   Axis   `yaml:"warehouses"`
	Duration     string `yaml:"duration"`
	Rampup       string `yaml:"rampup"`
	Repeats      int    `yaml:"repeats"`
	// P95Limit is the latency rule: a configuration counts only if its
	// New-Order (pgbench: transaction) p95 is at most this (default 20ms).
	P95Limit string  `yaml:"p95_limit"`
	Pgbench  Pgbench `yaml:"pgbench"`
	// LoadWorkers is the number of parallel loading connections.
	LoadWorkers int `yaml:"load_workers"`
	// Samplers is an axis of "on"/"off": with off, the wait sampler and the
	// ping probe do not run (to measure their cost). Default on.
	Samplers Axis `yaml:"samplers"`
	// CheckpointBeforeWindow runs CHECKPOINT at the end of ramp-up, so the
	// window starts right after a checkpoint (FPIs as after a checkpoint).
	CheckpointBeforeWindow bool `yaml:"checkpoint_before_window"`
	// Settle, when set, waits after each run's database clone until the
	// target's own processes are quiet (SettleQuietPct of the machine for
	// two seconds in a row), at most this long, before the run starts: a
	// strata pageserver turns a clone into image layers and uploads them,
	// background work that would otherwise run into the window.
	Settle string `yaml:"settle"`
	// Prewarm reads every relation of each run's database into
	// shared_buffers (pg_prewarm) after its clone, before ramp-up, so that
	// the window starts from the same warm cache on every target: a
	// stock target would otherwise find the clone's pages in the OS page
	// cache, a strata one fetches each from the pageserver. It runs
	// passes until the relations are in shared_buffers (runner.prewarm).
	Prewarm bool `yaml:"prewarm"`
	// Verify runs the TPC-C consistency checks after each run (default true).
	Verify *bool `yaml:"verify"`
	// Baseline names the target the others are compared with pair by pair
	// when the runs end (report.ComparePaired: the same configuration and
	// repeat); empty, no such summary.
	Baseline string `yaml:"baseline"`
}

// SettleQuietPct is the share of the machine (all cores = 100) under which
// a target counts as quiet for Settle.
const SettleQuietPct = 5

// SettleMax returns Settle as a duration (0 when unset).
func (m *Matrix) SettleMax() time.Duration {
	d, _ := time.ParseDuration(m.Settle)
	return d
}

// Config is one configuration: everything but the repeat number.
type Config struct {
	Target     target.Config
	Workload   string
	Settings   map[string]string
	VUs        int
	Warehouses int // pgbench: scale
	Duration   time.Duration
	Rampup     time.Duration
	Pgbench    Pgbench
	// NoSamplers turns the wait sampler and ping probe off.
	NoSamplers bool
}

// Run is one scheduled run.
type Run struct {
	Config
	Repeat int // 1-based
}

// SettingsLabel renders the settings sorted, "k=v k=v".
func (c Config) SettingsLabel() string {
	ks := make([]string, 0, len(c.Settings))
	for k := range c.Settings {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, 0, len(ks))
	for _, k := range ks {
		parts = append(parts, k+"="+c.Settings[k])
	}
	return strings.Join(parts, " ")
}

// Series names the configuration without its virtual users: the curve a
// report draws over virtual users.
func (c Config) Series() string {
	s := c.Target.Name
	if l := c.SettingsLabel(); l != "" {
		s += " " + l
	}
	if c.Workload == "pgbench" {
		s += fmt.Sprintf(" scale=%d", c.Warehouses)
	} else {
		s += fmt.Sprintf(" wh=%d", c.Warehouses)
	}
	if c.NoSamplers {
		s += " samplers=off"
	}
	return s
}

// Label names the configuration.
func (c Config) Label() string { return fmt.Sprintf("%s vus=%d", c.Series(), c.VUs) }

// Load reads and validates a matrix file.
func Load(path string) (*Matrix, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("matrix: %w", err)
	}
	return Parse(b)
}

// Parse reads and validates a matrix from YAML.
func Parse(b []byte) (*Matrix, error) {
	var m Matrix
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := m.defaults(); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *Matrix) defaults() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(f, a...)) }
	if m.Name == "" {
		return bad("name is required")
	}
	if m.Workload == "" {
		m.Workload = "tpcc"
	}
	if m.Workload != "tpcc" && m.Workload != "pgbench" {
		return bad("workload %q: want tpcc or pgbench", m.Workload)
	}
	if len(m.Targets) == 0 {
		return bad("at least one target is required")
	}
	seen := map[string]bool{}
	for i, t := range m.Targets {
		if t.Name == "" {
			m.Targets[i].Name = t.Kind
		}
		if seen[m.Targets[i].Name] {
			return bad("duplicate target name %q", m.Targets[i].Name)
		}
		seen[m.Targets[i].Name] = true
		if t.Kind == "" {
			return bad("target %s: kind is required", t.Name)
		}
		if err := target.CheckConfig(m.Targets[i]); err != nil {
			return bad("%v", err)
		}
	}
	if m.Baseline != "" && !seen[m.Baseline] {
		return bad("baseline %q is not one of the targets", m.Baseline)
	}
	if len(m.VirtualUsers) == 0 {
		m.VirtualUsers = Axis{"1"}
	}
	if len(m.Warehouses) == 0 {
		m.Warehouses = Axis{"1"}
	}
	if m.Duration == "" {
		m.Duration = "60s"
	}
	if m.Rampup == "" {
		m.Rampup = "10s"
	}
	if m.Repeats == 0 {
		m.Repeats = 1
	}
	if len(m.Samplers) == 0 {
		m.Samplers = Axis{"on"}
	}
	for _, v := range m.Samplers {
		if v != "on" && v != "off" {
			return bad("samplers: %q is not on or off", v)
		}
	}
	if m.P95Limit == "" {
		m.P95Limit = "20ms"
	}
	if m.Pgbench.Mode == "" {
		m.Pgbench.Mode = "prepared"
	}
	if m.Pgbench.Builtin == "" {
		m.Pgbench.Builtin = "tpcb-like"
	}
	for _, s := range []string{m.Duration, m.Rampup, m.P95Limit} {
		if _, err := time.ParseDuration(s); err != nil {
			return bad("%v", err)
		}
	}
	if m.Settle != "" {
		if d, err := time.ParseDuration(m.Settle); err != nil || d < 0 {
			return bad("settle: %q is not a duration", m.Settle)
		}
	}
	for _, a := range []Axis{m.VirtualUsers, m.Warehouses} {
		for _, v := range a {
			if n, err := strconv.Atoi(v); err != nil || n < 1 {
				return bad("%q is not a positive integer", v)
			}
		}
	}
	return nil
}

// P95 returns the latency rule.
func (m *Matrix) P95() time.Duration {
	d, _ := time.ParseDuration(m.P95Limit)
	return d
}

// VerifyEnabled reports whether consistency checks run after each run.
func (m *Matrix) VerifyEnabled() bool { return m.Verify == nil || *m.Verify }

// Configs expands the axes, target-major, then settings, warehouses and
// virtual users, so that consecutive configurations change as little as
// possible (fewer restarts and reloads).
func (m *Matrix) Configs() []Config {
	dur, _ := time.ParseDuration(m.Duration)
	ramp, _ := time.ParseDuration(m.Rampup)
	names := make([]string, 0, len(m.Settings))
	for k := range m.Settings {
		names = append(names, k)
	}
	sort.Strings(names)
	combos := []map[string]string{{}}
	for _, n := range names {
		var next []map[string]string
		for _, c := range combos {
			for _, v := range m.Settings[n] {
				cc := map[string]string{}
				for k, x := range c {
					cc[k] = x
				}
				cc[n] = v
				next = append(next, cc)
			}
		}
		combos = next
	}
	var out []Config
	for _, t := range m.Targets {
		for _, s := range combos {
			for _, w := range m.Warehouses {
				wn, _ := strconv.Atoi(w)
				for _, v := range m.VirtualUsers {
					vn, _ := strconv.Atoi(v)
					for _, smp := range m.Samplers {
						out = append(out, Config{Target: t, Workload: m.Workload, Settings: s, VUs: vn,
							Warehouses: wn, Duration: dur, Rampup: ramp, Pgbench: m.Pgbench,
							NoSamplers: smp == "off"})
					}
				}
			}
		}
	}
	return out
}

// Schedule returns every run: repeat 1 of all configurations, then repeat
// 2, and so on.
func (m *Matrix) Schedule() []Run {
	cs := m.Configs()
	out := make([]Run, 0, len(cs)*m.Repeats)
	for r := 1; r <= m.Repeats; r++ {
		for _, c := range cs {
			out = append(out, Run{Config: c, Repeat: r})
		}
	}
	return out
}
