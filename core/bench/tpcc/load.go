package tpcc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/sync/errgroup"
)

// ConnConfig parses base (a postgres:// URL or key=value string) and points
// it at database db.
func ConnConfig(base, db string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		return nil, fmt.Errorf("tpcc: parse %q: %w", base, err)
	}
	if db != "" {
		cfg.Database = db
	}
	return cfg, nil
}

// Connect opens one connection to database db of the server at base.
func Connect(ctx context.Context, base, db string) (*pgx.Conn, error) {
	cfg, err := ConnConfig(base, db)
	if err != nil {
		return nil, err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("tpcc: connect %s: %w", db, err)
	}
	return c, nil
}

// LoadOptions shape a load.
type LoadOptions struct {
	// Base is the server's connection string; its database is the one used
	// for CREATE DATABASE (usually "postgres").
	Base string
	// DB is the database to create (dropped first if it exists).
	DB         string
	Warehouses int
	// Workers is the number of parallel loading connections (default 2).
	Workers int
	// Progress, when not nil, receives a progress bar.
	Progress io.Writer
	Log      zerolog.Logger
	Seed     uint64
}

// ExpectedRows is the approximate number of rows a load writes (order lines
// count ten per order).
func ExpectedRows(warehouses int) int64 {
	perWH := 1 + DistrictsPerWH + StockPerWarehouse +
		DistrictsPerWH*(2*CustomersPerDistrict+OrdersPerDistrict*11+NewOrdersPerDistrict)
	return int64(Items + warehouses*perWH)
}

// Load creates database opts.DB and fills it with a TPC-C schema of
// opts.Warehouses warehouses, in parallel, then adds keys, indexes and the
// transaction functions, vacuums, analyzes and checkpoints.
func Load(ctx context.Context, opts LoadOptions) error {
	if opts.Warehouses < 1 {
		return fmt.Errorf("tpcc: warehouses must be >= 1, got %d", opts.Warehouses)
	}
	if opts.Workers < 1 {
		opts.Workers = 2
	}
	start := time.Now()
	admin, err := Connect(ctx, opts.Base, "")
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if err := DropDatabase(ctx, admin, opts.DB); err != nil {
		return err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{opts.DB}.Sanitize()); err != nil {
		return fmt.Errorf("tpcc: create database: %w", err)
	}
	c, err := Connect(ctx, opts.Base, opts.DB)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	for _, q := range tableDDL {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("tpcc: %s: %w", q[:30], err)
		}
	}

	var rows atomic.Int64
	var bar *progressbar.ProgressBar
	if opts.Progress != nil {
		bar = progressbar.NewOptions64(ExpectedRows(opts.Warehouses),
			progressbar.OptionSetWriter(opts.Progress),
			progressbar.OptionSetDescription(fmt.Sprintf("loading %d warehouses", opts.Warehouses)),
			progressbar.OptionShowCount(), progressbar.OptionThrottle(200*time.Millisecond),
			progressbar.OptionClearOnFinish())
	}
	count := func(n int) {
		rows.Add(int64(n))
		if bar != nil {
			_ = bar.Add(n)
		}
	}

	jobs := make(chan func(context.Context, *pgx.Conn) error)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(jobs)
		send := func(j func(context.Context, *pgx.Conn) error) bool {
			select {
			case jobs <- j:
				return true
			case <-gctx.Done():
				return false
			}
		}
		if !send(func(ctx context.Context, c *pgx.Conn) error {
			return loadItems(ctx, c, NewRand(opts.Seed+1, LoadConstants), count)
		}) {
			return nil
		}
		for w := 1; w <= opts.Warehouses; w++ {
			seed := opts.Seed + uint64(w)*7919
			if !send(func(ctx context.Context, c *pgx.Conn) error {
				return loadWarehouse(ctx, c, w, NewRand(seed, LoadConstants), count)
			}) {
				return nil
			}
		}
		return nil
	})
	for i := 0; i < opts.Workers; i++ {
		g.Go(func() error {
			wc, err := Connect(gctx, opts.Base, opts.DB)
			if err != nil {
				return err
			}
			defer wc.Close(context.Background())
			if _, err := wc.Exec(gctx, "SET synchronous_commit = off"); err != nil {
				return err
			}
			for j := range jobs {
				if err := j(gctx, wc); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("tpcc: load: %w", err)
	}
	if bar != nil {
		_ = bar.Finish()
	}
	opts.Log.Info().Int64("rows", rows.Load()).Dur("took", time.Since(start)).Msg("tpcc rows loaded; building indexes")

	if err := parallelExec(ctx, opts.Base, opts.DB, opts.Workers, indexDDL); err != nil {
		return err
	}
	for _, q := range procDDL {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("tpcc: create function: %w", err)
		}
	}
	for _, q := range []string{"VACUUM (ANALYZE, FREEZE)", "CHECKPOINT"} {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("tpcc: %s: %w", q, err)
		}
	}
	opts.Log.Info().Int("warehouses", opts.Warehouses).Dur("took", time.Since(start)).Msg("tpcc load done")
	return nil
}

// InstallFunctions (re)creates the five transaction functions in db.
func InstallFunctions(ctx context.Context, c *pgx.Conn) error {
	for _, q := range procDDL {
		if _, err := c.Exec(ctx, q); err != nil {
			return fmt.Errorf("tpcc: create function: %w", err)
		}
	}
	return nil
}

func parallelExec(ctx context.Context, base, db string, workers int, stmts []string) error {
	ch := make(chan string)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		defer close(ch)
		for _, s := range stmts {
			select {
			case ch <- s:
			case <-gctx.Done():
				return nil
			}
		}
		return nil
	})
	for i := 0; i < workers; i++ {
		g.Go(func() error {
			c, err := Connect(gctx, base, db)
			if err != nil {
				return err
			}
			defer c.Close(context.Background())
			for s := range ch {
				if _, err := c.Exec(gctx, s); err != nil {
					return fmt.Errorf("tpcc: %s: %w", s, err)
				}
			}
			return nil
		})
	}
	return g.Wait()
}

// DropDatabase drops db if it exists, disconnecting its sessions.
func DropDatabase(ctx context.Context, admin *pgx.Conn, db string) error {
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("tpcc: drop database %s: %w", db, err)
	}
	return nil
}

// CloneWait bounds how long Clone waits for the template's sessions to
// leave.
var CloneWait = 3 * time.Minute

// Clone creates database db as a file copy of template, so every run starts
// from the same data; db is dropped first. It checkpoints afterwards so
// that runs start right after a checkpoint.
//
// The template must have no sessions, and right after a start it can have
// one the bench did not open: the autoprewarm worker (the shared-buffers
// strategy, and stock Postgres with pg_prewarm) connects to each database
// whose blocks it loads, for as long as that takes. CREATE DATABASE waits
// only 5 s for other sessions, so Clone tries again while the template is
// in use (SQLSTATE 55006), up to CloneWait; waiting, when not nil, hears
// once who holds it. The error after that names the sessions.
func Clone(ctx context.Context, base, template, db string, waiting func(holders string)) error {
	admin, err := Connect(ctx, base, "")
	if err != nil {
		return err
	}
	defer admin.Close(context.Background())
	if err := DropDatabase(ctx, admin, db); err != nil {
		return err
	}
	q := fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY",
		pgx.Identifier{db}.Sanitize(), pgx.Identifier{template}.Sanitize())
	deadline := time.Now().Add(CloneWait)
	told := false
	for {
		_, err := admin.Exec(ctx, q)
		if err == nil {
			break
		}
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55006" {
			return fmt.Errorf("tpcc: clone %s from %s: %w", db, template, err)
		}
		holders := sessionsOn(ctx, admin, template)
		if time.Now().After(deadline) {
			return fmt.Errorf("tpcc: clone %s from %s: the template still has sessions after %s (%s): %w", db, template, CloneWait, holders, err)
		}
		if !told && waiting != nil {
			waiting(holders)
			told = true
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("tpcc: clone %s from %s: %w", db, template, ctx.Err())
		case <-time.After(time.Second):
		}
	}
	if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("tpcc: checkpoint: %w", err)
	}
	return nil
}

// sessionsOn names the sessions connected to db ("autoprewarm worker pid
// 123, ..."), or says why it cannot.
func sessionsOn(ctx context.Context, admin *pgx.Conn, db string) string {
	rows, err := admin.Query(ctx, "SELECT coalesce(nullif(backend_type, 'client backend'), 'client '||coalesce(application_name, '')), pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", db)
	if err != nil {
		return "sessions unknown: " + err.Error()
	}
	var out []string
	for rows.Next() {
		var kind string
		var pid int32
		if err := rows.Scan(&kind, &pid); err != nil {
			return "sessions unknown: " + err.Error()
		}
		out = append(out, fmt.Sprintf("%s pid %d", kind, pid))
	}
	if err := rows.Err(); err != nil {
		return "sessions unknown: " + err.Error()
	}
	if len(out) == 0 {
		return "no session left"
	}
	return strings.Join(out, ", ")
}

// DatabaseExists reports whether db exists and holds a loaded TPC-C schema
// with the given number of warehouses.
func DatabaseExists(ctx context.Context, base, db string, warehouses int) (bool, error) {
	admin, err := Connect(ctx, base, "")
	if err != nil {
		return false, err
	}
	defer admin.Close(context.Background())
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", db).Scan(&n); err != nil {
		return false, err
	}
	if n == 0 {
		return false, nil
	}
	c, err := Connect(ctx, base, db)
	if err != nil {
		return false, err
	}
	defer c.Close(context.Background())
	var w int
	var fn bool
	err = c.QueryRow(ctx, `SELECT (SELECT count(*) FROM warehouse),
		EXISTS (SELECT 1 FROM pg_proc WHERE proname = 'tpcc_slev')`).Scan(&w, &fn)
	if err != nil {
		return false, nil
	}
	return w == warehouses && fn, nil
}

const copyBatch = 1000

func copyRows(ctx context.Context, c *pgx.Conn, table string, cols []string, n int, row func(i int) []any, count func(int)) error {
	i := 0
	src := pgx.CopyFromFunc(func() ([]any, error) {
		if i >= n {
			return nil, nil
		}
		r := row(i)
		i++
		if i%copyBatch == 0 {
			count(copyBatch)
		}
		return r, nil
	})
	if _, err := c.CopyFrom(ctx, pgx.Identifier{table}, cols, src); err != nil {
		return fmt.Errorf("copy %s: %w", table, err)
	}
	count(n % copyBatch)
	return nil
}

func loadItems(ctx context.Context, c *pgx.Conn, g *Rand, count func(int)) error {
	return copyRows(ctx, c, "item", []string{"i_id", "i_im_id", "i_name", "i_price", "i_data"}, Items,
		func(i int) []any {
			return []any{i + 1, g.Int(1, 10000), g.AString(14, 24), float64(g.Int(100, 10000)) / 100, g.Data()}
		}, count)
}

func loadWarehouse(ctx context.Context, c *pgx.Conn, w int, g *Rand, count func(int)) error {
	now := time.Now().UTC().Truncate(time.Second)
	if err := copyRows(ctx, c, "warehouse", []string{"w_id", "w_ytd", "w_tax", "w_name", "w_street_1", "w_street_2", "w_city", "w_state", "w_zip"}, 1,
		func(int) []any {
			return []any{w, 300000.0, float64(g.Int(0, 2000)) / 10000, g.AString(6, 10), g.AString(10, 20), g.AString(10, 20), g.AString(10, 20), g.AString(2, 2), g.Zip()}
		}, count); err != nil {
		return err
	}
	if err := copyRows(ctx, c, "district", []string{"d_id", "d_w_id", "d_ytd", "d_tax", "d_next_o_id", "d_name", "d_street_1", "d_street_2", "d_city", "d_state", "d_zip"}, DistrictsPerWH,
		func(i int) []any {
			return []any{i + 1, w, 30000.0, float64(g.Int(0, 2000)) / 10000, OrdersPerDistrict + 1, g.AString(6, 10), g.AString(10, 20), g.AString(10, 20), g.AString(10, 20), g.AString(2, 2), g.Zip()}
		}, count); err != nil {
		return err
	}
	if err := copyRows(ctx, c, "stock", []string{"s_i_id", "s_w_id", "s_quantity", "s_dist_01", "s_dist_02", "s_dist_03", "s_dist_04", "s_dist_05", "s_dist_06", "s_dist_07", "s_dist_08", "s_dist_09", "s_dist_10", "s_ytd", "s_order_cnt", "s_remote_cnt", "s_data"}, StockPerWarehouse,
		func(i int) []any {
			r := []any{i + 1, w, g.Int(10, 100)}
			for d := 0; d < 10; d++ {
				r = append(r, g.AString(24, 24))
			}
			return append(r, 0, 0, 0, g.Data())
		}, count); err != nil {
		return err
	}
	for d := 1; d <= DistrictsPerWH; d++ {
		if err := copyRows(ctx, c, "customer", []string{"c_id", "c_d_id", "c_w_id", "c_first", "c_middle", "c_last", "c_street_1", "c_street_2", "c_city", "c_state", "c_zip", "c_phone", "c_since", "c_credit", "c_credit_lim", "c_discount", "c_balance", "c_ytd_payment", "c_payment_cnt", "c_delivery_cnt", "c_data"}, CustomersPerDistrict,
			func(i int) []any {
				id := i + 1
				last := LastName(g.NURand(255, 0, 999))
				if id <= 1000 {
					last = LastName(id - 1)
				}
				credit := "GC"
				if g.Int(1, 10) == 1 {
					credit = "BC"
				}
				return []any{id, d, w, g.AString(8, 16), "OE", last, g.AString(10, 20), g.AString(10, 20), g.AString(10, 20), g.AString(2, 2), g.Zip(), g.NString(16, 16), now, credit, 50000.0, float64(g.Int(0, 5000)) / 10000, -10.0, 10.0, 1, 0, g.AString(300, 500)}
			}, count); err != nil {
			return err
		}
		if err := copyRows(ctx, c, "history", []string{"h_c_id", "h_c_d_id", "h_c_w_id", "h_d_id", "h_w_id", "h_date", "h_amount", "h_data"}, CustomersPerDistrict,
			func(i int) []any { return []any{i + 1, d, w, d, w, now, 10.0, g.AString(12, 24)} }, count); err != nil {
			return err
		}
		perm := g.Perm(CustomersPerDistrict)
		olCnt := make([]int, OrdersPerDistrict)
		if err := copyRows(ctx, c, "orders", []string{"o_id", "o_w_id", "o_d_id", "o_c_id", "o_carrier_id", "o_ol_cnt", "o_all_local", "o_entry_d"}, OrdersPerDistrict,
			func(i int) []any {
				o := i + 1
				olCnt[i] = g.Int(5, 15)
				var carrier any
				if o < OrdersPerDistrict-NewOrdersPerDistrict+1 {
					carrier = g.Int(1, 10)
				}
				return []any{o, w, d, perm[i], carrier, olCnt[i], 1, now}
			}, count); err != nil {
			return err
		}
		var lines [][2]int
		for i, n := range olCnt {
			for l := 1; l <= n; l++ {
				lines = append(lines, [2]int{i + 1, l})
			}
		}
		if err := copyRows(ctx, c, "order_line", []string{"ol_w_id", "ol_d_id", "ol_o_id", "ol_number", "ol_i_id", "ol_delivery_d", "ol_amount", "ol_supply_w_id", "ol_quantity", "ol_dist_info"}, len(lines),
			func(i int) []any {
				o, l := lines[i][0], lines[i][1]
				var deliv any
				amount := 0.0
				if o < OrdersPerDistrict-NewOrdersPerDistrict+1 {
					deliv = now
				} else {
					amount = float64(g.Int(1, 999999)) / 100
				}
				return []any{w, d, o, l, g.Int(1, Items), deliv, amount, w, 5, g.AString(24, 24)}
			}, count); err != nil {
			return err
		}
		if err := copyRows(ctx, c, "new_order", []string{"no_w_id", "no_d_id", "no_o_id"}, NewOrdersPerDistrict,
			func(i int) []any { return []any{w, d, OrdersPerDistrict - NewOrdersPerDistrict + 1 + i} }, count); err != nil {
			return err
		}
	}
	return nil
}
