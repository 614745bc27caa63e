// Package results keeps strata bench runs: each run's configuration,
// machine, git revision, headline figures, latency percentiles, wait
// profile, scalar metrics and time series. It stores them in embedded
// SQLite (modernc.org/sqlite, no cgo) by default, or in PostgreSQL when
// given a postgres:// URL.
//
// It does not compute anything; core/bench/runner fills runs and
// core/bench/report reads them.
package results

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
	_ "modernc.org/sqlite"             // the "sqlite" database/sql driver
)

// ErrNotFound is returned by Get for an unknown run id.
var ErrNotFound = errors.New("results: run not found")

// Latency is one transaction type's latency over a run window.
type Latency struct {
	Tx                 string
	Count, Errors      int64
	P50, P95, P99, Max float64 // milliseconds
	Mean               float64 // milliseconds
}

// StrataConfigPrefix marks a strata config key of a kind strata target in
// Run.Settings ("strata:storage.pushdown_deltas"), next to the Postgres
// settings.
const StrataConfigPrefix = "strata:"

// Point is one time-series sample.
type Point struct{ T, V float64 }

// Run is one measured run.
type Run struct {
	ID         int64
	Matrix     string
	Label      string // configuration, e.g. "stock full_page_writes=on wh=4 vus=8"
	Series     string // configuration without virtual users
	Target     string
	TargetKind string
	Workload   string
	Repeat     int
	VUs        int
	Warehouses int
	Settings   map[string]string
	Machine    map[string]string
	GitRev     string
	StartedAt  time.Time
	WindowSec  float64
	// Status is "ok", "interrupted" or "failed".
	Status string
	// NOPM and TPM (tpcc); for pgbench TPM is transactions per minute and
	// NOPM is zero.
	NOPM, TPM float64
	// P95 is the headline p95 latency in ms (new order; pgbench: all).
	P95   float64
	Notes []string
	// Metrics, Latency, Waits and TimeSeries are filled by Get, not by List.
	Metrics    map[string]float64
	Latency    []Latency
	Waits      map[string]int64
	TimeSeries map[string][]Point
}

// Store is a results database. It is safe for concurrent use.
type Store struct {
	db     *sql.DB
	pg     bool
	Source string
}

// Open opens (and creates) the results database at dsn: a file path for
// SQLite, or a postgres:// URL.
func Open(ctx context.Context, dsn string) (*Store, error) {
	s := &Store{Source: dsn}
	var err error
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		s.pg = true
		s.db, err = sql.Open("pgx", dsn)
	} else {
		if dir := filepath.Dir(dsn); dir != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return nil, fmt.Errorf("results: %w", err)
			}
		}
		s.db, err = sql.Open("sqlite", dsn+"?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)")
		if err == nil {
			s.db.SetMaxOpenConns(1)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("results: open %s: %w", dsn, err)
	}
	if err := s.migrate(ctx); err != nil {
		s.db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

func (s *Store) migrate(ctx context.Context) error {
	id := "INTEGER PRIMARY KEY AUTOINCREMENT"
	if s.pg {
		id = "BIGSERIAL PRIMARY KEY"
	}
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS bench_runs (
			id ` + id + `, matrix TEXT NOT NULL, label TEXT NOT NULL, series TEXT NOT NULL,
			target TEXT NOT NULL, target_kind TEXT NOT NULL, workload TEXT NOT NULL,
			repeat INTEGER NOT NULL, vus INTEGER NOT NULL, warehouses INTEGER NOT NULL,
			settings TEXT NOT NULL, machine TEXT NOT NULL, git_rev TEXT NOT NULL,
			started_at TEXT NOT NULL, window_s DOUBLE PRECISION NOT NULL, status TEXT NOT NULL,
			nopm DOUBLE PRECISION NOT NULL, tpm DOUBLE PRECISION NOT NULL,
			p95_ms DOUBLE PRECISION NOT NULL, notes TEXT NOT NULL)`,
		`CREATE TABLE IF NOT EXISTS bench_metrics (run_id BIGINT NOT NULL, name TEXT NOT NULL,
			value DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, name))`,
		`CREATE TABLE IF NOT EXISTS bench_latency (run_id BIGINT NOT NULL, tx TEXT NOT NULL,
			count BIGINT NOT NULL, errors BIGINT NOT NULL, p50_ms DOUBLE PRECISION NOT NULL,
			p95_ms DOUBLE PRECISION NOT NULL, p99_ms DOUBLE PRECISION NOT NULL,
			max_ms DOUBLE PRECISION NOT NULL, mean_ms DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, tx))`,
		`CREATE TABLE IF NOT EXISTS bench_waits (run_id BIGINT NOT NULL, event TEXT NOT NULL,
			samples BIGINT NOT NULL, PRIMARY KEY (run_id, event))`,
		`CREATE TABLE IF NOT EXISTS bench_series (run_id BIGINT NOT NULL, series TEXT NOT NULL,
			t DOUBLE PRECISION NOT NULL, value DOUBLE PRECISION NOT NULL)`,
		`CREATE INDEX IF NOT EXISTS bench_series_run ON bench_series (run_id, series)`,
	}
	for _, q := range stmts {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("results: migrate: %w", err)
		}
	}
	return nil
}

// rebind turns ? placeholders into $n for PostgreSQL.
func (s *Store) rebind(q string) string {
	if !s.pg {
		return q
	}
	var b strings.Builder
	n := 0
	for _, r := range q {
		if r == '?' {
			n++
			b.WriteString("$" + strconv.Itoa(n))
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// Save stores r (with its details) in one transaction and sets r.ID.
func (s *Store) Save(ctx context.Context, r *Run) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("results: %w", err)
	}
	defer tx.Rollback()
	notes := r.Notes
	if notes == nil {
		notes = []string{}
	}
	err = tx.QueryRowContext(ctx, s.rebind(`INSERT INTO bench_runs (matrix, label, series, target,
		target_kind, workload, repeat, vus, warehouses, settings, machine, git_rev, started_at,
		window_s, status, nopm, tpm, p95_ms, notes)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id`),
		r.Matrix, r.Label, r.Series, r.Target, r.TargetKind, r.Workload, r.Repeat, r.VUs, r.Warehouses,
		mustJSON(r.Settings), mustJSON(r.Machine), r.GitRev, r.StartedAt.UTC().Format(time.RFC3339Nano),
		r.WindowSec, r.Status, r.NOPM, r.TPM, r.P95, mustJSON(notes)).Scan(&r.ID)
	if err != nil {
		return fmt.Errorf("results: insert run: %w", err)
	}
	for k, v := range r.Metrics {
		if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO bench_metrics VALUES (?, ?, ?)`), r.ID, k, v); err != nil {
			return fmt.Errorf("results: insert metric: %w", err)
		}
	}
	for _, l := range r.Latency {
		if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO bench_latency VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`),
			r.ID, l.Tx, l.Count, l.Errors, l.P50, l.P95, l.P99, l.Max, l.Mean); err != nil {
			return fmt.Errorf("results: insert latency: %w", err)
		}
	}
	for k, v := range r.Waits {
		if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO bench_waits VALUES (?, ?, ?)`), r.ID, k, v); err != nil {
			return fmt.Errorf("results: insert wait: %w", err)
		}
	}
	for name, pts := range r.TimeSeries {
		for _, p := range pts {
			if _, err := tx.ExecContext(ctx, s.rebind(`INSERT INTO bench_series VALUES (?, ?, ?, ?)`), r.ID, name, p.T, p.V); err != nil {
				return fmt.Errorf("results: insert series: %w", err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("results: commit: %w", err)
	}
	return nil
}

// Filter narrows List.
type Filter struct {
	Matrix string
	Limit  int
}

const runCols = `id, matrix, label, series, target, target_kind, workload, repeat, vus, warehouses,
	settings, machine, git_rev, started_at, window_s, status, nopm, tpm, p95_ms, notes`

func scanRun(sc interface{ Scan(...any) error }) (Run, error) {
	var r Run
	var settings, machine, started, notes string
	err := sc.Scan(&r.ID, &r.Matrix, &r.Label, &r.Series, &r.Target, &r.TargetKind, &r.Workload,
		&r.Repeat, &r.VUs, &r.Warehouses, &settings, &machine, &r.GitRev, &started, &r.WindowSec,
		&r.Status, &r.NOPM, &r.TPM, &r.P95, &notes)
	if err != nil {
		return r, err
	}
	_ = json.Unmarshal([]byte(settings), &r.Settings)
	_ = json.Unmarshal([]byte(machine), &r.Machine)
	_ = json.Unmarshal([]byte(notes), &r.Notes)
	r.StartedAt, _ = time.Parse(time.RFC3339Nano, started)
	return r, nil
}

// List returns runs (headline fields only), oldest first.
func (s *Store) List(ctx context.Context, f Filter) ([]Run, error) {
	q := "SELECT " + runCols + " FROM bench_runs"
	var args []any
	if f.Matrix != "" {
		q += " WHERE matrix = ?"
		args = append(args, f.Matrix)
	}
	q += " ORDER BY id"
	if f.Limit > 0 {
		q = "SELECT * FROM (" + strings.Replace(q, " ORDER BY id", " ORDER BY id DESC", 1) +
			" LIMIT " + strconv.Itoa(f.Limit) + ") x ORDER BY id"
	}
	rows, err := s.db.QueryContext(ctx, s.rebind(q), args...)
	if err != nil {
		return nil, fmt.Errorf("results: list: %w", err)
	}
	defer rows.Close()
	var out []Run
	for rows.Next() {
		r, err := scanRun(rows)
		if err != nil {
			return nil, fmt.Errorf("results: list: %w", err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Get returns one run with all its details.
func (s *Store) Get(ctx context.Context, id int64) (*Run, error) {
	r, err := scanRun(s.db.QueryRowContext(ctx, s.rebind("SELECT "+runCols+" FROM bench_runs WHERE id = ?"), id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: %d", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("results: get: %w", err)
	}
	r.Metrics, r.Waits, r.TimeSeries = map[string]float64{}, map[string]int64{}, map[string][]Point{}
	rows, err := s.db.QueryContext(ctx, s.rebind("SELECT name, value FROM bench_metrics WHERE run_id = ?"), id)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	for rows.Next() {
		var k string
		var v float64
		if err := rows.Scan(&k, &v); err != nil {
			rows.Close()
			return nil, err
		}
		r.Metrics[k] = v
	}
	rows.Close()
	rows, err = s.db.QueryContext(ctx, s.rebind("SELECT tx, count, errors, p50_ms, p95_ms, p99_ms, max_ms, mean_ms FROM bench_latency WHERE run_id = ? ORDER BY tx"), id)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	for rows.Next() {
		var l Latency
		if err := rows.Scan(&l.Tx, &l.Count, &l.Errors, &l.P50, &l.P95, &l.P99, &l.Max, &l.Mean); err != nil {
			rows.Close()
			return nil, err
		}
		r.Latency = append(r.Latency, l)
	}
	rows.Close()
	rows, err = s.db.QueryContext(ctx, s.rebind("SELECT event, samples FROM bench_waits WHERE run_id = ?"), id)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			rows.Close()
			return nil, err
		}
		r.Waits[k] = v
	}
	rows.Close()
	rows, err = s.db.QueryContext(ctx, s.rebind("SELECT series, t, value FROM bench_series WHERE run_id = ? ORDER BY series, t"), id)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	for rows.Next() {
		var k string
		var p Point
		if err := rows.Scan(&k, &p.T, &p.V); err != nil {
			rows.Close()
			return nil, err
		}
		r.TimeSeries[k] = append(r.TimeSeries[k], p)
	}
	rows.Close()
	return &r, rows.Err()
}

// GetMany returns full runs for ids, in the order given.
func (s *Store) GetMany(ctx context.Context, ids []int64) ([]*Run, error) {
	out := make([]*Run, 0, len(ids))
	for _, id := range ids {
		r, err := s.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
