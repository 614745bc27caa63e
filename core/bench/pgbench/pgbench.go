// Package pgbench runs PostgreSQL's pgbench for strata bench: initialize a
// database at a scale, then run a builtin script with a number of clients
// and a protocol mode, and turn its per-transaction log into a latency
// histogram and a throughput series over a timed window after ramp-up.
//
// It drives the pgbench program; it does not reimplement it.
package pgbench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/rs/zerolog"
)

// DefaultBinDir is where Debian installs PostgreSQL 15.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// Options shape an init or a run.
type Options struct {
	BinDir string
	// URL is a connection string to the database to use.
	URL      string
	Scale    int
	Clients  int
	Threads  int
	Rampup   time.Duration
	Duration time.Duration
	// Mode is --protocol: simple, extended or prepared.
	Mode string
	// Builtin is --builtin: tpcb-like, simple-update or select-only.
	Builtin string
	Log     zerolog.Logger
	// Tick receives pgbench's per-second progress lines.
	Tick func(line string)
	// BeforeWindow, OnWindow and OnWindowEnd are called at the end of
	// ramp-up (in that order for the first two) and at the end.
	BeforeWindow func(ctx context.Context) error
	OnWindow     func()
	OnWindowEnd  func()
}

func (o *Options) bin(name string) string {
	d := o.BinDir
	if d == "" {
		d = DefaultBinDir
	}
	return filepath.Join(d, name)
}

// Init runs pgbench -i at opts.Scale.
func Init(ctx context.Context, opts Options) error {
	out, err := exec.CommandContext(ctx, opts.bin("pgbench"), "-i", "-q", "-s", strconv.Itoa(opts.Scale), opts.URL).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pgbench: init: %w\n%s", err, out)
	}
	return nil
}

// Result is a run's window.
type Result struct {
	WindowStart, WindowEnd time.Time
	Transactions           int64
	Failed                 int64
	TPS                    float64
	// Latency is per transaction, microseconds.
	Latency *hdrhistogram.Histogram
	// TPSSeries is transactions per second, per second of the window.
	TPSSeries   [][2]float64
	Interrupted bool
}

// Run runs pgbench for Rampup+Duration and measures the last Duration.
// Cancelling ctx stops pgbench (SIGINT) and keeps what was measured.
func Run(ctx context.Context, opts Options) (*Result, error) {
	dir, err := os.MkdirTemp("", "strata-pgbench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	threads := opts.Threads
	if threads < 1 {
		threads = min(opts.Clients, 2)
	}
	total := opts.Rampup + opts.Duration
	args := []string{"-n", "-c", strconv.Itoa(opts.Clients), "-j", strconv.Itoa(threads),
		"-T", strconv.Itoa(int(total.Seconds())), "-M", opts.Mode, "-b", opts.Builtin, "-P", "1",
		"-l", "--log-prefix", filepath.Join(dir, "log"), opts.URL}
	cmd := exec.Command(opts.bin("pgbench"), args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = nil
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgbench: start: %w", err)
	}
	var tail []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			l := sc.Text()
			if strings.HasPrefix(l, "progress:") {
				if opts.Tick != nil {
					opts.Tick(l)
				}
				continue
			}
			tail = append(tail, l)
			if len(tail) > 20 {
				tail = tail[1:]
			}
		}
	}()
	res := &Result{}
	winStart := start.Add(opts.Rampup)
	ramp := time.NewTimer(opts.Rampup)
	defer ramp.Stop()
	waitErr := make(chan error, 1)
	go func() { <-done; waitErr <- cmd.Wait() }()
	inWindow := false
	var werr error
loop:
	for {
		select {
		case <-ramp.C:
			if opts.BeforeWindow != nil {
				if err := opts.BeforeWindow(ctx); err != nil {
					opts.Log.Warn().Err(err).Msg("before window")
				}
			}
			winStart = time.Now()
			inWindow = true
			if opts.OnWindow != nil {
				opts.OnWindow()
			}
		case <-ctx.Done():
			_ = cmd.Process.Signal(os.Interrupt)
			res.Interrupted = true
			werr = <-waitErr
			break loop
		case werr = <-waitErr:
			break loop
		}
	}
	res.WindowStart, res.WindowEnd = winStart, time.Now()
	if inWindow && opts.OnWindowEnd != nil {
		opts.OnWindowEnd()
	}
	if !inWindow {
		if werr != nil {
			return nil, fmt.Errorf("pgbench: %w\n%s", werr, strings.Join(tail, "\n"))
		}
		return nil, fmt.Errorf("pgbench: ended before the window")
	}
	if werr != nil && !res.Interrupted {
		return nil, fmt.Errorf("pgbench: %w\n%s", werr, strings.Join(tail, "\n"))
	}
	if err := readLogs(dir, res); err != nil {
		return nil, err
	}
	return res, nil
}

// readLogs reads pgbench's per-transaction logs: "client_id transaction_no
// time script_no time_epoch time_us", time being the latency in µs; a
// time of "failed" or "skipped" marks a failure.
func readLogs(dir string, res *Result) error {
	files, _ := filepath.Glob(filepath.Join(dir, "log*"))
	res.Latency = hdrhistogram.New(1, 60_000_000, 3)
	w0 := res.WindowStart.UnixMicro()
	w1 := res.WindowEnd.UnixMicro()
	perSec := map[int64]int64{}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 6 {
				continue
			}
			sec, _ := strconv.ParseInt(fs[4], 10, 64)
			us, _ := strconv.ParseInt(fs[5], 10, 64)
			at := sec*1_000_000 + us
			if at < w0 || at > w1 {
				continue
			}
			lat, err := strconv.ParseInt(fs[2], 10, 64)
			if err != nil {
				res.Failed++
				continue
			}
			_ = res.Latency.RecordValue(lat)
			res.Transactions++
			perSec[(at-w0)/1_000_000]++
		}
		fh.Close()
	}
	secs := res.WindowEnd.Sub(res.WindowStart).Seconds()
	if secs > 0 {
		res.TPS = float64(res.Transactions) / secs
	}
	// Whole seconds only: a last partial second would read low.
	for s := int64(0); float64(s+1) <= secs; s++ {
		res.TPSSeries = append(res.TPSSeries, [2]float64{float64(s + 1), float64(perSec[s])})
	}
	return nil
}
