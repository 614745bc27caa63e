// Package collect measures what happens around a benchmark run: wait
// events sampled from pg_stat_activity (every 10 ms), deltas of pg_stat_wal,
// pg_stat_database, pg_stat_bgwriter and the WAL insert position, host and
// per-process CPU from /proc (to flag runs where other processes were
// busy), a Prometheus /metrics endpoint's deltas, and a SELECT 1 ping probe.
//
// It does not drive load; core/bench/tpcc and core/bench/pgbench do.
package collect

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
)

// AppPrefix marks the collector's own sessions, which the wait sampler
// leaves out.
const AppPrefix = "strata-bench-"

// Options shape a collection.
type Options struct {
	// URL is a connection string to the server; DB is the database under
	// load (its pg_stat_database row and its sessions are sampled).
	URL, DB string
	// MonitorDB is the database the collector's own sessions connect to
	// (default DB). A database of their own keeps their transactions out
	// of the workload's counts.
	MonitorDB string
	// WaitInterval is the pg_stat_activity sampling period (default 10 ms);
	// PingInterval the SELECT 1 probe period (default 100 ms).
	WaitInterval, PingInterval time.Duration
	// NoSamplers turns off the wait sampler and the ping probe (to measure
	// their cost); snapshots and CPU accounting still run.
	NoSamplers bool
	// Target names the server's processes on this machine, for the CPU
	// split (Who: root PIDs, or else process names).
	Target Who
	// MetricsURL, when set, is scraped at start and stop.
	MetricsURL string
	// MetricsURLs are more endpoints scraped at start and stop, by prefix:
	// their series are stored as "<prefix>.<series>" (prefix "": as
	// MetricsURL).
	MetricsURLs map[string]string
	Log         zerolog.Logger
}

// Result is what a collection measured between Start and Stop.
type Result struct {
	Duration time.Duration
	// Waits counts samples per wait ("Type:Event", "CPU" for an active
	// session not waiting, "Client:ClientRead" for idle sessions).
	Waits map[string]int64
	// WaitTicks is the number of sampling rounds taken.
	WaitTicks int64
	// Stats holds deltas: "wal.*", "db.*", "bgwriter.*", and
	// "wal.lsn_bytes" from the WAL insert position.
	Stats map[string]float64
	// StartLSN and EndLSN bound the window's WAL.
	StartLSN, EndLSN string
	// Ping holds SELECT 1 latencies in microseconds.
	Ping *hdrhistogram.Histogram
	CPU  CPU
	// Metrics holds deltas of the scraped Prometheus series.
	Metrics map[string]float64
	// Errors lists what could not be collected.
	Errors []string
}

// Collector is one running collection. Start and Stop are called once each,
// from one goroutine.
type Collector struct {
	opts   Options
	start  time.Time
	stats0 map[string]float64
	lsn0   string
	cpu0   cpuSnap
	prom0  map[string]map[string]float64 // by prefix

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	waits     map[string]int64
	waitTicks int64
	ping      *hdrhistogram.Histogram
	errs      []string
}

func connect(ctx context.Context, url, db, app string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	if db != "" {
		cfg.Database = db
	}
	cfg.RuntimeParams["application_name"] = AppPrefix + app
	return pgx.ConnectConfig(ctx, cfg)
}

// Start takes the opening snapshots and starts the samplers.
func Start(ctx context.Context, opts Options) (*Collector, error) {
	if opts.WaitInterval <= 0 {
		opts.WaitInterval = 10 * time.Millisecond
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = 100 * time.Millisecond
	}
	if opts.MonitorDB == "" {
		opts.MonitorDB = opts.DB
	}
	c := &Collector{opts: opts, waits: map[string]int64{}, ping: hdrhistogram.New(1, 60_000_000, 3)}
	conn, err := connect(ctx, opts.URL, opts.MonitorDB, "snapshot")
	if err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	defer conn.Close(context.Background())
	c.prom0 = map[string]map[string]float64{}
	for prefix, url := range c.endpoints() {
		p, err := scrape(ctx, url)
		if err != nil {
			c.errs = append(c.errs, err.Error())
			continue
		}
		c.prom0[prefix] = p
	}
	c.cpu0 = readCPU()
	if c.stats0, c.lsn0, err = statSnapshot(ctx, conn, opts.DB); err != nil {
		return nil, err
	}
	c.start = time.Now()
	sctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if !opts.NoSamplers {
		wc, err := connect(ctx, opts.URL, opts.MonitorDB, "waits")
		if err != nil {
			cancel()
			return nil, fmt.Errorf("collect: %w", err)
		}
		pc, err := connect(ctx, opts.URL, opts.MonitorDB, "ping")
		if err != nil {
			wc.Close(context.Background())
			cancel()
			return nil, fmt.Errorf("collect: %w", err)
		}
		c.wg.Add(2)
		go c.sampleWaits(sctx, wc)
		go c.probe(sctx, pc)
	}
	return c, nil
}

// Stop stops the samplers, takes the closing snapshots and returns the
// deltas.
func (c *Collector) Stop(ctx context.Context) (*Result, error) {
	c.cancel()
	c.wg.Wait()
	r := &Result{Duration: time.Since(c.start), Waits: c.waits, WaitTicks: c.waitTicks, Ping: c.ping, Errors: c.errs}
	conn, err := connect(ctx, c.opts.URL, c.opts.MonitorDB, "snapshot")
	if err != nil {
		return nil, fmt.Errorf("collect: %w", err)
	}
	defer conn.Close(context.Background())
	stats1, lsn1, err := statSnapshot(ctx, conn, c.opts.DB)
	if err != nil {
		return nil, err
	}
	r.CPU = cpuDelta(c.cpu0, readCPU(), c.opts.Target)
	r.Stats = map[string]float64{}
	for k, v := range stats1 {
		r.Stats[k] = v - c.stats0[k]
	}
	var diff float64
	if err := conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1, $2)::float8", lsn1, c.lsn0).Scan(&diff); err == nil {
		r.Stats["wal.lsn_bytes"] = diff
	}
	r.StartLSN, r.EndLSN = c.lsn0, lsn1
	for prefix, url := range c.endpoints() {
		p0, ok := c.prom0[prefix]
		if !ok {
			continue
		}
		p1, err := scrape(ctx, url)
		if err != nil {
			r.Errors = append(r.Errors, err.Error())
			continue
		}
		if r.Metrics == nil {
			r.Metrics = map[string]float64{}
		}
		pre := ""
		if prefix != "" {
			pre = prefix + "."
		}
		for k, v := range p1 {
			r.Metrics[pre+k] = v - p0[k]
		}
	}
	return r, nil
}

// endpoints returns the Prometheus endpoints to scrape by prefix.
func (c *Collector) endpoints() map[string]string {
	out := map[string]string{}
	for prefix, url := range c.opts.MetricsURLs {
		if url != "" {
			out[prefix] = url
		}
	}
	if c.opts.MetricsURL != "" {
		out[""] = c.opts.MetricsURL
	}
	return out
}

// statSnapshot reads the cumulative statistics views as one flat map.
func statSnapshot(ctx context.Context, c *pgx.Conn, db string) (map[string]float64, string, error) {
	out := map[string]float64{}
	var lsn string
	if err := c.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn); err != nil {
		return nil, "", fmt.Errorf("collect: wal position: %w", err)
	}
	views := []struct{ prefix, sql string }{
		{"wal.", "SELECT row_to_json(w)::text FROM pg_stat_wal w"},
		{"db.", "SELECT row_to_json(d)::text FROM pg_stat_database d WHERE datname = $1"},
		{"bgwriter.", "SELECT row_to_json(b)::text FROM pg_stat_bgwriter b"},
	}
	for _, v := range views {
		var js string
		var err error
		if v.prefix == "db." {
			err = c.QueryRow(ctx, v.sql, db).Scan(&js)
		} else {
			err = c.QueryRow(ctx, v.sql).Scan(&js)
		}
		if err != nil {
			return nil, "", fmt.Errorf("collect: %s: %w", v.sql, err)
		}
		m := map[string]any{}
		if err := json.Unmarshal([]byte(js), &m); err != nil {
			return nil, "", fmt.Errorf("collect: %w", err)
		}
		for k, x := range m {
			if f, ok := x.(float64); ok && k != "datid" {
				out[v.prefix+k] = f
			}
		}
	}
	return out, lsn, nil
}

// sampleFunc samples pg_stat_activity inside the server: n rounds, sleep
// seconds apart, each on a fresh snapshot (pg_stat_clear_snapshot), and
// returns the counts per wait. One call per chunk replaces n round trips,
// which keeps the sampler's cost far below the 5% budget.
const sampleFunc = `CREATE OR REPLACE FUNCTION strata_bench_sample_waits(p_db name, p_n int, p_sleep float8)
RETURNS TABLE(wait text, samples bigint) AS $$
DECLARE acc text[] := '{}';
BEGIN
  FOR i IN 1..p_n LOOP
    PERFORM pg_stat_clear_snapshot();
    acc := acc || ARRAY(
      SELECT CASE WHEN state <> 'active' AND wait_event_type IS NULL THEN 'Client:Idle'
                  WHEN wait_event_type IS NULL THEN 'CPU'
                  ELSE wait_event_type || ':' || wait_event END
        FROM pg_stat_activity
       WHERE datname = p_db AND backend_type = 'client backend' AND pid <> pg_backend_pid()
         AND application_name NOT LIKE 'strata-bench-%');
    PERFORM pg_sleep(p_sleep);
  END LOOP;
  RETURN QUERY SELECT k, count(*) FROM unnest(acc) k GROUP BY k;
END $$ LANGUAGE plpgsql`

// chunk is how long one server-side sampling call lasts; at Stop the
// samples of the chunk in flight (at most this long) are lost.
const chunk = 200 * time.Millisecond

func (c *Collector) sampleWaits(ctx context.Context, conn *pgx.Conn) {
	defer c.wg.Done()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sampleFunc); err != nil {
		if ctx.Err() == nil {
			c.addErr("wait sampler: " + err.Error())
		}
		return
	}
	n := int(chunk / c.opts.WaitInterval)
	if n < 1 {
		n = 1
	}
	for ctx.Err() == nil {
		rows, err := conn.Query(ctx, "SELECT wait, samples FROM strata_bench_sample_waits($1, $2, $3)",
			c.opts.DB, n, c.opts.WaitInterval.Seconds())
		if err != nil {
			if ctx.Err() == nil {
				c.addErr("wait sampler: " + err.Error())
			}
			return
		}
		local := map[string]int64{}
		for rows.Next() {
			var k string
			var v int64
			if err := rows.Scan(&k, &v); err != nil {
				break
			}
			local[k] += v
		}
		rows.Close()
		if rows.Err() != nil {
			if ctx.Err() == nil {
				c.addErr("wait sampler: " + rows.Err().Error())
			}
			return
		}
		c.mu.Lock()
		for k, v := range local {
			c.waits[k] += v
		}
		c.waitTicks += int64(n)
		c.mu.Unlock()
	}
}

// WaitKey names a sampled session's wait: "CPU" for an active session with
// no wait event, "Type:Event" otherwise ("Client:ClientRead" for idle ones).
func WaitKey(state, typ, event string) string {
	switch {
	case state != "active" && typ == "":
		return "Client:Idle"
	case typ == "":
		return "CPU"
	default:
		return typ + ":" + event
	}
}

func (c *Collector) probe(ctx context.Context, conn *pgx.Conn) {
	defer c.wg.Done()
	defer conn.Close(context.Background())
	t := time.NewTicker(c.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t0 := time.Now()
		var one int
		if err := conn.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
			if ctx.Err() == nil {
				c.addErr("ping: " + err.Error())
			}
			return
		}
		c.mu.Lock()
		_ = c.ping.RecordValue(time.Since(t0).Microseconds())
		c.mu.Unlock()
	}
}

func (c *Collector) addErr(s string) {
	c.mu.Lock()
	c.errs = append(c.errs, s)
	c.mu.Unlock()
	c.opts.Log.Warn().Str("error", s).Msg("collector")
}
