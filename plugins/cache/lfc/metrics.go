package lfc

import "github.com/prometheus/client_golang/prometheus"

var (
	descHits      = prometheus.NewDesc("strata_lfc_hits_total", "LFC lookups that found the page.", nil, nil)
	descMisses    = prometheus.NewDesc("strata_lfc_misses_total", "LFC lookups that did not find the page.", nil, nil)
	descPuts      = prometheus.NewDesc("strata_lfc_puts_total", "Pages stored in the LFC.", nil, nil)
	descStale     = prometheus.NewDesc("strata_lfc_stale_puts_total", "Puts ignored because a newer LSN was cached.", nil, nil)
	descEvictions = prometheus.NewDesc("strata_lfc_evictions_total", "LFC chunks evicted.", nil, nil)
	descInvalid   = prometheus.NewDesc("strata_lfc_invalidations_total", "LFC pages invalidated.", nil, nil)
	descPages     = prometheus.NewDesc("strata_lfc_pages", "Pages held by the LFC.", nil, nil)
	descUsed      = prometheus.NewDesc("strata_lfc_used_bytes", "LFC capacity in use (whole chunks).", nil, nil)
	descCapacity  = prometheus.NewDesc("strata_lfc_capacity_bytes", "LFC capacity.", nil, nil)
)

// statsCollector exports the Stats of the cache that current returns.
type statsCollector struct{ current func() *Cache }

// Collector exports the statistics (strata_lfc_*) of the cache current
// returns at each scrape, nothing while it returns nil: for an owner that
// builds a new cache now and then (the compute agent, at each start of
// Postgres) and registers one collector for them all. A cache built with
// Options.Registry registers its own.
func Collector(current func() *Cache) prometheus.Collector { return statsCollector{current} }

func (s statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHits, descMisses, descPuts, descStale, descEvictions, descInvalid, descPages, descUsed, descCapacity} {
		ch <- d
	}
}

func (s statsCollector) Collect(ch chan<- prometheus.Metric) {
	c := s.current()
	if c == nil {
		return
	}
	st := c.Stats()
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge := func(d *prometheus.Desc, v int64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(descHits, st.Hits)
	counter(descMisses, st.Misses)
	counter(descPuts, st.Puts)
	counter(descStale, st.StalePuts)
	counter(descEvictions, st.Evictions)
	counter(descInvalid, st.Invalidations)
	gauge(descPages, st.Pages)
	gauge(descUsed, st.UsedBytes)
	gauge(descCapacity, st.CapacityBytes)
}
