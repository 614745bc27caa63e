package cache

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Names of the waits the cache tiers record. The compute agent adds its own
// (GetPage, relation size lookups, ...) to the same Waits.
const (
	WaitLFCLock  = "lfc_lock"  // blocked on a contended LFC partition lock
	WaitLFCRead  = "lfc_read"  // copying a page out of the LFC (RAM copy or pread)
	WaitLFCWrite = "lfc_write" // copying a page into the LFC (RAM copy or pwrite)
)

// MaxWaitKinds is the most kinds one Waits can hold.
const MaxWaitKinds = 16

// waitStripes is the number of counter stripes. Recorders pass a stripe hint
// (a partition number) so that goroutines working on different partitions do
// not bounce one cache line between cores.
const waitStripes = 32

// WaitKind is the index of a wait kind in its Waits.
type WaitKind int

type waitCounter struct{ count, ns atomic.Int64 }

// one stripe is MaxWaitKinds*16 = 256 bytes: a whole number of cache lines.
type waitStripe [MaxWaitKinds]waitCounter

// Waits is the wait accounting of the compute agent: for each kind of wait it
// imposes on Postgres, how many times it happened and the total time spent.
// Recording is lock-free (striped atomic counters) and allocation-free.
// A nil *Waits records nothing.
type Waits struct {
	names   []string
	stripes [waitStripes]waitStripe
}

// WaitStat is one kind's totals.
type WaitStat struct {
	Name  string
	Count int64
	Total time.Duration
}

// NewWaits returns a Waits with the given kinds, in order (kind i is
// names[i]). Names must be distinct and at most MaxWaitKinds.
func NewWaits(names ...string) (*Waits, error) {
	if len(names) > MaxWaitKinds {
		return nil, fmt.Errorf("cache: %d wait kinds, at most %d", len(names), MaxWaitKinds)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || seen[n] {
			return nil, fmt.Errorf("cache: wait kind %q empty or repeated", n)
		}
		seen[n] = true
	}
	return &Waits{names: append([]string(nil), names...)}, nil
}

// Kind returns the kind named name, or false if w does not have it.
func (w *Waits) Kind(name string) (WaitKind, bool) {
	if w == nil {
		return -1, false
	}
	for i, n := range w.names {
		if n == name {
			return WaitKind(i), true
		}
	}
	return -1, false
}

// Add records one wait of kind k lasting d. stripe is any small integer that
// tends to differ between concurrent callers (a partition number); it only
// spreads the counters. Add on a nil Waits, or with k < 0, does nothing.
func (w *Waits) Add(k WaitKind, stripe int, d time.Duration) {
	if w == nil || k < 0 {
		return
	}
	c := &w.stripes[uint(stripe)%waitStripes][k]
	c.count.Add(1)
	c.ns.Add(int64(d))
}

// Snapshot returns the totals of every kind, in kind order.
func (w *Waits) Snapshot() []WaitStat {
	if w == nil {
		return nil
	}
	out := make([]WaitStat, len(w.names))
	for i, n := range w.names {
		out[i].Name = n
		for s := range w.stripes {
			out[i].Count += w.stripes[s][i].count.Load()
			out[i].Total += time.Duration(w.stripes[s][i].ns.Load())
		}
	}
	return out
}

// Get returns the totals of the kind named name (zero if absent).
func (w *Waits) Get(name string) WaitStat {
	for _, s := range w.Snapshot() {
		if s.Name == name {
			return s
		}
	}
	return WaitStat{Name: name}
}

// Collector returns a Prometheus collector exporting
// strata_wait_events_total{wait="..."} and strata_wait_seconds_total{wait="..."}.
func (w *Waits) Collector() prometheus.Collector { return waitsCollector{w} }

var (
	waitCountDesc = prometheus.NewDesc("strata_wait_events_total",
		"Number of waits the compute agent imposed, by kind.", []string{"wait"}, nil)
	waitSecondsDesc = prometheus.NewDesc("strata_wait_seconds_total",
		"Total time of the waits the compute agent imposed, by kind.", []string{"wait"}, nil)
)

type waitsCollector struct{ w *Waits }

func (c waitsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- waitCountDesc
	ch <- waitSecondsDesc
}

func (c waitsCollector) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.w.Snapshot() {
		ch <- prometheus.MustNewConstMetric(waitCountDesc, prometheus.CounterValue, float64(s.Count), s.Name)
		ch <- prometheus.MustNewConstMetric(waitSecondsDesc, prometheus.CounterValue, s.Total.Seconds(), s.Name)
	}
}
