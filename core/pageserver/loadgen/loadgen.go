// Package loadgen drives a pageserver's GetPage API over gRPC with many
// concurrent clients and measures what they see: latency percentiles from
// HDR histograms (p50, p90, p99, p99.9, max) and pages per second, for
// pages served from the pageserver's page cache (cached), materialized from
// layer files on local disk (uncached), or fetched from the object store
// after their layers were evicted (cold).
//
// Setup writes a working set of pages in two versions (writeback page
// writes at OldW and NewW). A read at the latest LSN is answered by the
// page cache once warm; a read at an LSN between the two versions is
// older than the cached (newest) value, so the pageserver looks it up in
// its layers every time. Every answer is checked against the expected
// version's bytes.
//
// Local runs a pageserver in process (its gRPC server on a loopback port)
// for the CLI's `strata pageserver bench` and for tests; Run works as well
// against any pageserver address.
//
// The package does not start Postgres and does not measure writes.
package loadgen

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/sdk/pg"
)

// Mode says which kind of read a run measures.
type Mode string

// The read modes.
const (
	// Cached reads at the latest LSN, answered by the page cache (the
	// working set is read once before measuring).
	Cached Mode = "cached"
	// Uncached reads at an LSN older than each page's newest version:
	// every read goes to the layers (in memory or local layer files).
	Uncached Mode = "uncached"
	// Cold is Uncached after the caller evicted the layer files to the
	// object store (Local.Evict): one pass over the working set in random
	// order, so each layer's first read downloads it.
	Cold Mode = "cold"
)

// ParseMode parses a mode name.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case Cached, Uncached, Cold:
		return m, nil
	}
	return "", fmt.Errorf("loadgen: unknown mode %q (cached, uncached, cold)", s)
}

// The two versions Setup writes: pages are written at OldW, then again at
// NewW; uncached reads ask for ReadOldLSN.
const (
	OldW       = pg.LSN(0x1000000)
	NewW       = pg.LSN(0x2000000)
	ReadOldLSN = OldW + 1
)

// Config describes a run. Zero values take the defaults in comments.
type Config struct {
	Timeline pg.TimelineID // zero: DefaultTimeline
	Rel      pg.RelTag     // zero: DefaultRel
	Pages    uint32        // working set in pages (0: 4096, 32 MiB)
	Clients  int           // concurrent readers (0: 16)
	// Duration and Requests bound the measured run; the first reached
	// ends it (both zero: 10 s). Cold runs end after one pass anyway.
	Duration time.Duration
	Requests int64
	Mode     Mode // "": Cached
	// Progress, when set, receives a progress line (carriage-return
	// updated) every ProgressEvery (0: 1 s).
	Progress      io.Writer
	ProgressEvery time.Duration
	Seed          uint64
}

// Defaults for Config.
var (
	DefaultTimeline = pg.TimelineID{0x10, 0xAD}
	DefaultRel      = pg.RelTag{Spc: 1663, DB: 5, Rel: 424242}
)

func (c Config) withDefaults() Config {
	if c.Timeline.IsZero() {
		c.Timeline = DefaultTimeline
	}
	if c.Rel == (pg.RelTag{}) {
		c.Rel = DefaultRel
	}
	if c.Pages == 0 {
		c.Pages = 4096
	}
	if c.Clients <= 0 {
		c.Clients = 16
	}
	if c.Duration == 0 && c.Requests == 0 {
		c.Duration = 10 * time.Second
	}
	if c.Mode == "" {
		c.Mode = Cached
	}
	if c.ProgressEvery <= 0 {
		c.ProgressEvery = time.Second
	}
	return c
}

// PageData returns the content Setup writes to block blk as version v
// (0: at OldW, 1: at NewW): a header naming both, then a pattern.
func PageData(blk uint32, v int) []byte {
	p := make([]byte, pg.BlockSize)
	binary.BigEndian.PutUint32(p, blk)
	p[4] = byte(v)
	for i := 8; i < len(p); i++ {
		p[i] = byte(int(blk)*7 + v*13 + i)
	}
	return p
}

func pageOK(p []byte, blk uint32, v int) bool {
	return len(p) == pg.BlockSize && binary.BigEndian.Uint32(p) == blk && p[4] == byte(v) &&
		p[pg.BlockSize-1] == byte(int(blk)*7+v*13+pg.BlockSize-1)
}

// Setup creates cfg's timeline (an existing one is reused) and writes the
// working set in both versions.
func Setup(ctx context.Context, c *client.Client, cfg Config) error {
	cfg = cfg.withDefaults()
	if _, err := c.CreateTimeline(ctx, cfg.Timeline); err != nil && !errors.Is(err, pageserver.ErrTimelineExists) {
		return fmt.Errorf("loadgen: create timeline: %w", err)
	}
	if err := c.AdvanceCommitLSN(ctx, cfg.Timeline, NewW); err != nil {
		return fmt.Errorf("loadgen: advance commit LSN: %w", err)
	}
	for v, w := range []pg.LSN{OldW, NewW} {
		for b := uint32(0); b < cfg.Pages; b += 256 {
			var ws []client.PageWrite
			for blk := b; blk < min(b+256, cfg.Pages); blk++ {
				ws = append(ws, client.PageWrite{Page: cfg.Rel.Page(blk), W: w, Data: PageData(blk, v)})
			}
			if _, err := c.PutPages(ctx, cfg.Timeline, ws); err != nil {
				return fmt.Errorf("loadgen: put pages: %w", err)
			}
		}
	}
	return nil
}

// Result is what a run measured. Latencies are per GetPage call as the
// client sees it (one page per call).
type Result struct {
	Mode        Mode
	Clients     int
	Requests    int64
	Errors      int64 // failed calls and wrong pages
	Elapsed     time.Duration
	PagesPerSec float64
	Mean        time.Duration
	P50         time.Duration
	P90         time.Duration
	P99         time.Duration
	P999        time.Duration
	Max         time.Duration
	// Hist holds every latency in nanoseconds.
	Hist *hdrhistogram.Histogram
}

// String formats the result on one line.
func (r Result) String() string {
	return fmt.Sprintf("%-8s clients=%d pages=%d errors=%d %.0f pages/s  p50 %s  p90 %s  p99 %s  p99.9 %s  max %s",
		r.Mode, r.Clients, r.Requests, r.Errors, r.PagesPerSec, us(r.P50), us(r.P90), us(r.P99), us(r.P999), us(r.Max))
}

func us(d time.Duration) string { return fmt.Sprintf("%.0fus", float64(d.Nanoseconds())/1e3) }

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, int64(time.Minute), 3) }

// Run measures GetPage with cfg.Clients goroutines sharing c (its calls
// are multiplexed over one stream, as the compute agent's are). The
// working set must have been written by Setup. It returns an error only
// when the run could not start; failed calls count as Errors.
func Run(ctx context.Context, c *client.Client, cfg Config) (Result, error) {
	cfg = cfg.withDefaults()
	req := client.PageRequest{RequestLSN: client.LatestLSN}
	want := 1
	if cfg.Mode != Cached {
		req.RequestLSN, want = ReadOldLSN, 0
	}
	if cfg.Mode == Cached {
		// Warm the page cache; check the working set exists.
		for blk := uint32(0); blk < cfg.Pages; blk++ {
			r := req
			r.Page = cfg.Rel.Page(blk)
			p, err := c.GetPage(ctx, cfg.Timeline, r)
			if err != nil {
				return Result{}, fmt.Errorf("loadgen: warm-up read of block %d: %w", blk, err)
			}
			if !pageOK(p, blk, want) {
				return Result{}, fmt.Errorf("loadgen: block %d holds the wrong data (was Setup run?)", blk)
			}
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if cfg.Duration > 0 {
		var c2 context.CancelFunc
		runCtx, c2 = context.WithTimeout(runCtx, cfg.Duration)
		defer c2()
	}
	limit := cfg.Requests
	var order []uint32
	if cfg.Mode == Cold {
		for _, b := range rand.New(rand.NewPCG(cfg.Seed, 1)).Perm(int(cfg.Pages)) {
			order = append(order, uint32(b))
		}
		if limit == 0 || limit > int64(len(order)) {
			limit = int64(len(order))
		}
	}
	var (
		issued, done, errs atomic.Int64
		mu                 sync.Mutex
		total              = newHist()
		wg                 sync.WaitGroup
	)
	start := time.Now()
	stopProgress := progress(cfg, &done, &errs, start)
	for i := 0; i < cfg.Clients; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			h := newHist()
			rng := rand.New(rand.NewPCG(cfg.Seed, uint64(i)+2))
			for runCtx.Err() == nil {
				n := issued.Add(1)
				if limit > 0 && n > limit {
					break
				}
				blk := rng.Uint32N(cfg.Pages)
				if order != nil {
					blk = order[n-1]
				}
				r := req
				r.Page = cfg.Rel.Page(blk)
				t0 := time.Now()
				p, err := c.GetPage(runCtx, cfg.Timeline, r)
				d := time.Since(t0)
				if err != nil && runCtx.Err() != nil {
					break // the run ended during the call
				}
				_ = h.RecordValue(d.Nanoseconds())
				done.Add(1)
				if err != nil || !pageOK(p, blk, want) {
					errs.Add(1)
				}
			}
			mu.Lock()
			total.Merge(h)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	stopProgress()
	res := Result{
		Mode: cfg.Mode, Clients: cfg.Clients, Requests: done.Load(), Errors: errs.Load(), Elapsed: elapsed,
		Mean: time.Duration(total.Mean()), P50: time.Duration(total.ValueAtQuantile(50)),
		P90: time.Duration(total.ValueAtQuantile(90)), P99: time.Duration(total.ValueAtQuantile(99)),
		P999: time.Duration(total.ValueAtQuantile(99.9)), Max: time.Duration(total.Max()), Hist: total,
	}
	if elapsed > 0 {
		res.PagesPerSec = float64(res.Requests) / elapsed.Seconds()
	}
	return res, nil
}

// progress prints a line every cfg.ProgressEvery until the returned
// function is called (which prints the final line and a newline).
func progress(cfg Config, done, errs *atomic.Int64, start time.Time) func() {
	if cfg.Progress == nil {
		return func() {}
	}
	stop := make(chan struct{})
	finished := make(chan struct{})
	line := func() {
		el := time.Since(start)
		n := done.Load()
		fmt.Fprintf(cfg.Progress, "\r%-8s %6.1fs  %9d pages  %9.0f pages/s  %d errors ", cfg.Mode, el.Seconds(), n, float64(n)/el.Seconds(), errs.Load())
	}
	go func() {
		defer close(finished)
		t := time.NewTicker(cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				line()
				fmt.Fprintln(cfg.Progress)
				return
			case <-t.C:
				line()
			}
		}
	}()
	return func() { close(stop); <-finished }
}
