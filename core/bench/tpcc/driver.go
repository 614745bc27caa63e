package tpcc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/rs/zerolog"
)

// Tx is a TPROC-C transaction type.
type Tx int

// The five transactions.
const (
	NewOrder Tx = iota
	Payment
	Delivery
	StockLevel
	OrderStatus
	numTx
)

// TxNames are the names results use for each Tx.
var TxNames = [numTx]string{"new_order", "payment", "delivery", "stock_level", "order_status"}

func (t Tx) String() string { return TxNames[t] }

// Pick maps a uniform draw 1..23 to a transaction, HammerDB's mix: new order
// 10, payment 10, delivery, stock level and order status 1 each.
func Pick(n int) Tx {
	switch {
	case n <= 10:
		return NewOrder
	case n <= 20:
		return Payment
	case n == 21:
		return Delivery
	case n == 22:
		return StockLevel
	default:
		return OrderStatus
	}
}

// ErrInterrupted is returned by Run when it is cancelled before the timed
// window began, so nothing was measured.
var ErrInterrupted = errors.New("tpcc: interrupted before the timed window")

// Options shape a driver run.
type Options struct {
	Base, DB string
	// ExcludeDB is a database whose transactions TPM leaves out: the one
	// the bench's own samplers use. HammerDB counts every database; on a
	// server dedicated to the benchmark this differs only by the samplers.
	ExcludeDB  string
	Warehouses int
	VUs        int
	Rampup     time.Duration
	Duration   time.Duration
	Seed       uint64
	Log        zerolog.Logger
	// Tick, if set, is called about every Interval with a live summary.
	Tick     func(Live)
	Interval time.Duration
	// OnWindow, if set, is called when the timed window starts (after
	// ramp-up), so samplers can align to it.
	OnWindow func()
	// BeforeWindow, if set, runs after ramp-up, before the window's opening
	// snapshot (for example a CHECKPOINT); the users keep running.
	BeforeWindow func(ctx context.Context) error
	// OnWindowEnd, if set, is called right after the window's closing
	// snapshot, before the virtual users stop.
	OnWindowEnd func()
}

// Live is a running summary.
type Live struct {
	Elapsed   time.Duration
	InWindow  bool
	NOPM      float64 // over the last interval
	TxPerSec  float64
	Errors    int64
	Rollbacks int64
}

// Point is one sample of a time series, T seconds from the start of the
// timed window.
type Point struct {
	T, V float64
}

// Result is what a run measured over its timed window.
type Result struct {
	WindowStart, WindowEnd time.Time
	// NOPM is new orders per minute: the delta of sum(d_next_o_id).
	NOPM float64
	// TPM is the delta of xact_commit + xact_rollback over all databases
	// in pg_stat_database, per minute, as HammerDB counts.
	TPM       float64
	NewOrders int64
	Xacts     int64
	// Latency holds per transaction histograms in microseconds.
	Latency   map[string]*hdrhistogram.Histogram
	Count     map[string]int64
	Errors    map[string]int64
	Rollbacks int64
	// NOPMSeries is NOPM per Interval over the window.
	NOPMSeries  []Point
	Interrupted bool
}

type counters struct {
	sumNext int64
	xacts   int64
}

func snapshot(ctx context.Context, c *pgx.Conn, exclude string) (counters, error) {
	var s counters
	err := c.QueryRow(ctx, `SELECT (SELECT coalesce(sum(d_next_o_id), 0) FROM district),
		(SELECT coalesce(sum(xact_commit + xact_rollback), 0) FROM pg_stat_database
		 WHERE datname IS DISTINCT FROM $1)`, exclude).Scan(&s.sumNext, &s.xacts)
	return s, err
}

type vu struct {
	id, home int
	g        *Rand
	hist     [numTx]*hdrhistogram.Histogram
	count    [numTx]int64
	errs     [numTx]int64
	rollback int64
	done     atomic.Int64
	nerr     atomic.Int64
}

// Run drives opts.VUs virtual users against opts.DB: ramp-up, then a timed
// window. Cancelling ctx during the window stops the run early and returns
// what was measured with Interrupted set.
func Run(ctx context.Context, opts Options) (*Result, error) {
	if opts.VUs < 1 || opts.Warehouses < 1 {
		return nil, fmt.Errorf("tpcc: need vus >= 1 and warehouses >= 1")
	}
	if opts.Interval <= 0 {
		opts.Interval = 5 * time.Second
	}
	mon, err := Connect(ctx, opts.Base, opts.DB)
	if err != nil {
		return nil, err
	}
	defer mon.Close(context.Background())
	if _, err := mon.Exec(ctx, "SET stats_fetch_consistency = none"); err != nil {
		return nil, err
	}

	vus := make([]*vu, opts.VUs)
	conns := make([]*pgx.Conn, opts.VUs)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
	}()
	for i := range vus {
		v := &vu{id: i, home: i%opts.Warehouses + 1, g: NewRand(opts.Seed+uint64(i)*104729+1, RunConstants)}
		for t := range v.hist {
			v.hist[t] = hdrhistogram.New(1, 60_000_000, 3)
		}
		vus[i] = v
		if conns[i], err = Connect(ctx, opts.Base, opts.DB); err != nil {
			return nil, err
		}
	}

	var recording atomic.Bool
	runCtx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for i, v := range vus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v.loop(runCtx, opts, &conns[i], &recording)
		}()
	}
	stopAll := func() {
		stop()
		wg.Wait()
	}

	start := time.Now()
	tick := time.NewTicker(opts.Interval)
	defer tick.Stop()
	total := func() (n, e int64) {
		for _, v := range vus {
			n += v.done.Load()
			e += v.nerr.Load()
		}
		return
	}
	lastTx, _ := total()
	lastT := time.Now()
	var lastSnap counters
	var haveSnap bool
	report := func(inWindow bool) {
		now := time.Now()
		n, e := total()
		live := Live{Elapsed: now.Sub(start), InWindow: inWindow, Errors: e,
			TxPerSec: float64(n-lastTx) / now.Sub(lastT).Seconds()}
		if s, err := snapshot(ctx, mon, opts.ExcludeDB); err == nil {
			if haveSnap {
				live.NOPM = float64(s.sumNext-lastSnap.sumNext) / now.Sub(lastT).Minutes()
			}
			lastSnap, haveSnap = s, true
		}
		lastTx, lastT = n, now
		if opts.Tick != nil {
			opts.Tick(live)
		}
	}

	// Ramp-up.
	rampEnd := time.NewTimer(opts.Rampup)
	defer rampEnd.Stop()
ramp:
	for {
		select {
		case <-ctx.Done():
			stopAll()
			return nil, ErrInterrupted
		case <-rampEnd.C:
			break ramp
		case <-tick.C:
			report(false)
		}
	}

	// Timed window.
	if opts.BeforeWindow != nil {
		if err := opts.BeforeWindow(ctx); err != nil {
			stopAll()
			return nil, fmt.Errorf("tpcc: before window: %w", err)
		}
	}
	s0, err := snapshot(ctx, mon, opts.ExcludeDB)
	if err != nil {
		stopAll()
		return nil, fmt.Errorf("tpcc: snapshot: %w", err)
	}
	res := &Result{WindowStart: time.Now()}
	recording.Store(true)
	if opts.OnWindow != nil {
		opts.OnWindow()
	}
	lastSnap, haveSnap, lastT = s0, true, res.WindowStart
	windowEnd := time.NewTimer(opts.Duration)
	defer windowEnd.Stop()
window:
	for {
		select {
		case <-ctx.Done():
			res.Interrupted = true
			break window
		case <-windowEnd.C:
			break window
		case <-tick.C:
			prev := lastSnap
			report(true)
			res.NOPMSeries = append(res.NOPMSeries, Point{
				T: time.Since(res.WindowStart).Seconds(),
				V: float64(lastSnap.sumNext-prev.sumNext) / opts.Interval.Minutes()})
		}
	}
	recording.Store(false)
	res.WindowEnd = time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s1, err := snapshot(sctx, mon, opts.ExcludeDB)
	if opts.OnWindowEnd != nil {
		opts.OnWindowEnd()
	}
	stopAll()
	if err != nil {
		return nil, fmt.Errorf("tpcc: snapshot: %w", err)
	}
	mins := res.WindowEnd.Sub(res.WindowStart).Minutes()
	res.NewOrders = s1.sumNext - s0.sumNext
	res.Xacts = s1.xacts - s0.xacts
	res.NOPM = float64(res.NewOrders) / mins
	res.TPM = float64(res.Xacts) / mins
	res.Latency = map[string]*hdrhistogram.Histogram{}
	res.Count = map[string]int64{}
	res.Errors = map[string]int64{}
	for t := Tx(0); t < numTx; t++ {
		h := hdrhistogram.New(1, 60_000_000, 3)
		for _, v := range vus {
			h.Merge(v.hist[t])
			res.Count[t.String()] += v.count[t]
			res.Errors[t.String()] += v.errs[t]
		}
		res.Latency[t.String()] = h
	}
	for _, v := range vus {
		res.Rollbacks += v.rollback
	}
	return res, nil
}

func (v *vu) loop(ctx context.Context, opts Options, cp **pgx.Conn, recording *atomic.Bool) {
	logged := 0
	for ctx.Err() == nil {
		c := *cp
		t := Pick(v.g.Int(1, 23))
		t0 := time.Now()
		rolledBack, err := v.exec(ctx, c, t, opts.Warehouses)
		el := time.Since(t0)
		if ctx.Err() != nil {
			return
		}
		rec := recording.Load()
		if err != nil {
			v.nerr.Add(1)
			if rec {
				v.errs[t]++
			}
			if logged < 3 {
				opts.Log.Warn().Err(err).Int("vu", v.id).Str("tx", t.String()).Msg("tpcc transaction failed")
				logged++
			}
			if c.IsClosed() {
				nc, cerr := Connect(ctx, opts.Base, opts.DB)
				if cerr != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				c.Close(context.Background())
				*cp = nc
			}
			continue
		}
		v.done.Add(1)
		if rec {
			_ = v.hist[t].RecordValue(el.Microseconds())
			v.count[t]++
			if rolledBack {
				v.rollback++
			}
		}
	}
}

type line struct{ item, supply, qty int }

// exec runs one transaction; rolledBack reports the new order's intended
// rollback (an unused item id), which counts as a completed transaction.
func (v *vu) exec(ctx context.Context, c *pgx.Conn, t Tx, warehouses int) (rolledBack bool, err error) {
	g, w := v.g, v.home
	other := func() int {
		if warehouses == 1 {
			return w
		}
		o := g.Int(1, warehouses-1)
		if o >= w {
			o++
		}
		return o
	}
	var n int64
	switch t {
	case NewOrder:
		d, cid := g.Int(1, DistrictsPerWH), g.CustomerID()
		cnt := g.Int(5, 15)
		rollback := g.Int(1, 100) == 1
		lines := make([]line, cnt)
		allLocal := 1
		for i := range lines {
			l := line{item: g.ItemID(), supply: w, qty: g.Int(1, 10)}
			if g.Int(1, 100) == 1 {
				l.supply = other()
			}
			if l.supply != w {
				allLocal = 0
			}
			lines[i] = l
		}
		// Lock stock rows in one order across transactions, so that
		// concurrent new orders cannot deadlock.
		slices.SortFunc(lines, func(a, b line) int {
			if a.supply != b.supply {
				return a.supply - b.supply
			}
			return a.item - b.item
		})
		if rollback {
			lines[cnt-1].item = Items + 1
		}
		items, supply, qty := make([]int32, cnt), make([]int32, cnt), make([]int32, cnt)
		for i, l := range lines {
			items[i], supply[i], qty[i] = int32(l.item), int32(l.supply), int32(l.qty)
		}
		var total float64
		err = c.QueryRow(ctx, "SELECT tpcc_neword($1, $2, $3, $4, $5, $6, $7)::float8",
			w, d, cid, allLocal, items, supply, qty).Scan(&total)
		var pe *pgconn.PgError
		if rollback && errors.As(err, &pe) && pe.Code == RollbackSQLState {
			return true, nil
		}
		return false, err
	case Payment:
		d := g.Int(1, DistrictsPerWH)
		cw, cd := w, d
		if g.Int(1, 100) > 85 && warehouses > 1 {
			cw, cd = other(), g.Int(1, DistrictsPerWH)
		}
		byName := g.Int(1, 100) <= 60
		last, cid := "", 0
		if byName {
			last = g.RunLastName()
		} else {
			cid = g.CustomerID()
		}
		amount := float64(g.Int(100, 500000)) / 100
		err = c.QueryRow(ctx, "SELECT tpcc_payment($1, $2, $3, $4, $5, $6, $7, $8)",
			w, d, cw, cd, cid, byName, last, amount).Scan(&n)
	case Delivery:
		err = c.QueryRow(ctx, "SELECT tpcc_delivery($1, $2)", w, g.Int(1, 10)).Scan(&n)
	case StockLevel:
		err = c.QueryRow(ctx, "SELECT tpcc_slev($1, $2, $3)", w, g.Int(1, DistrictsPerWH), g.Int(10, 20)).Scan(&n)
	case OrderStatus:
		d := g.Int(1, DistrictsPerWH)
		byName := g.Int(1, 100) <= 60
		last, cid := "", 0
		if byName {
			last = g.RunLastName()
		} else {
			cid = g.CustomerID()
		}
		err = c.QueryRow(ctx, "SELECT tpcc_ostat($1, $2, $3, $4, $5)", w, d, cid, byName, last).Scan(&n)
	}
	return false, err
}
