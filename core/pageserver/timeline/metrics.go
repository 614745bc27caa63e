package timeline

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the engine's Prometheus metrics, shared by all timelines of
// a pageserver. A nil *Metrics records nothing.
type Metrics struct {
	reads         prometheus.Counter
	cacheHits     prometheus.Counter
	readAmp       prometheus.Histogram
	redoDeltas    prometheus.Histogram
	layers        *prometheus.GaugeVec
	lastRecord    *prometheus.GaugeVec
	ingestLag     *prometheus.GaugeVec
	uploadLag     *prometheus.GaugeVec
	pending       *prometheus.GaugeVec
	history       *prometheus.GaugeVec
	leases        *prometheus.GaugeVec
	flushedBytes  prometheus.Counter
	uploadedBytes prometheus.Counter
	downloadBytes prometheus.Counter
	evictions     prometheus.Counter
	uploadErrors  prometheus.Counter
	manifestSaves prometheus.Counter
	raisedWrites  prometheus.Counter
	unsupported   prometheus.Counter
	imageBytes    prometheus.Counter
	imageKept     prometheus.Counter
	zeroPages     prometheus.Counter
}

// NewMetrics registers the engine metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		reads:     prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_reads_total", Help: "Key reads (GetPage, Nblocks, file blocks)."}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_cache_hits_total", Help: "Reads answered by the materialized page cache."}),
		readAmp:   prometheus.NewHistogram(prometheus.HistogramOpts{Name: "strata_pageserver_read_amplification", Help: "Layer files consulted per uncached read.", Buckets: []float64{0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64}}),
		redoDeltas: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "strata_pageserver_redo_deltas_per_read",
			Help:    "WAL records (deltas) applied to rebuild a relation page on an uncached read; 0 when an image answered.",
			Buckets: []float64{0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128}}),
		layers:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_layers", Help: "Layer files per timeline, kind and level."}, []string{"timeline", "kind", "level"}),
		lastRecord: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_last_record_lsn", Help: "Highest LSN ingested or put."}, []string{"timeline"}),
		ingestLag:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_ingest_lag_bytes", Help: "Commit LSN minus last record LSN."}, []string{"timeline"}),
		uploadLag:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_upload_lag_bytes", Help: "Last record LSN minus remote consistent LSN."}, []string{"timeline"}),
		pending:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_gate_pending_versions", Help: "Page writes waiting for the commit LSN."}, []string{"timeline"}),
		history: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_history_bytes",
			Help: "Last record LSN minus GC cutoff: the WAL span of page history kept (storage.pitr, storage.gc_horizon, branch points and leases)."}, []string{"timeline"}),
		leases: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "strata_pageserver_leases",
			Help: "Running leases that hold GC below an LSN (restores reading there)."}, []string{"timeline"}),
		flushedBytes:  prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_flushed_bytes_total", Help: "Bytes written to layer files by flushes."}),
		uploadedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_uploaded_bytes_total", Help: "Layer bytes uploaded."}),
		downloadBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_downloaded_bytes_total", Help: "Layer bytes fetched on demand."}),
		evictions:     prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_evictions_total", Help: "Layer files evicted from local disk."}),
		uploadErrors:  prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_upload_errors_total", Help: "Failed upload rounds (retried)."}),
		manifestSaves: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_local_manifest_saves_total", Help: "Local manifest writes (each with an fsync); skipped when nothing changed."}),
		raisedWrites: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_writes_raised_total",
			Help: "Compute writes whose W lay below the newest image layer's LSN, stored at that LSN instead (else the image would hide them)."}),
		unsupported: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_redo_unsupported_total",
			Help: "Images the image policy wanted at ingest but the redo engine could not make: a record of the page is of a type it does not replay (an extension's resource manager, an unknown record type). Ingest goes on; reads of those pages fail."}),
		imageBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_image_bytes_total",
			Help: "Bytes of image layer files written by image passes (only the key ranges that changed since their image are rewritten)."}),
		imageKept: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_image_kept_bytes_total",
			Help: "Bytes of image layer files that image passes left in place, their key ranges unchanged since (summed per pass)."}),
		zeroPages: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_pageserver_zero_pages_total",
			Help: "Compute page writes of all zeros (a relation's extension), stored as a marker without their 8 KiB."}),
	}
	reg.MustRegister(m.imageBytes, m.imageKept, m.reads, m.cacheHits, m.readAmp, m.redoDeltas, m.layers, m.lastRecord, m.ingestLag, m.uploadLag, m.pending,
		m.history, m.leases, m.flushedBytes, m.uploadedBytes, m.downloadBytes, m.evictions, m.uploadErrors, m.manifestSaves, m.raisedWrites, m.unsupported, m.zeroPages)
	return m
}

func (m *Metrics) read(hit bool, layers int) {
	if m == nil {
		return
	}
	m.reads.Inc()
	if hit {
		m.cacheHits.Inc()
	} else {
		m.readAmp.Observe(float64(layers))
	}
}

// reconstructed records the deltas applied to rebuild one relation page.
func (m *Metrics) reconstructed(deltas int) {
	if m != nil {
		m.redoDeltas.Observe(float64(deltas))
	}
}

func (m *Metrics) raised(n int) {
	if m != nil && n > 0 {
		m.raisedWrites.Add(float64(n))
	}
}

func (m *Metrics) zeroPagesPut(n int) {
	if m != nil && n > 0 {
		m.zeroPages.Add(float64(n))
	}
}

// imagePass records an image pass: bytes written and bytes kept.
func (m *Metrics) imagePass(written, kept int64) {
	if m != nil {
		m.imageBytes.Add(float64(written))
		m.imageKept.Add(float64(kept))
	}
}

func (m *Metrics) unsupportedImage() {
	if m != nil {
		m.unsupported.Inc()
	}
}

func (m *Metrics) downloaded(n int64) {
	if m != nil {
		m.downloadBytes.Add(float64(n))
	}
}

func (m *Metrics) observeLayers(t *Timeline) {
	if m == nil {
		return
	}
	id := t.id.String()
	t.mu.RLock()
	st := t.layers.Stats()
	t.mu.RUnlock()
	m.layers.DeletePartialMatch(prometheus.Labels{"timeline": id})
	m.layers.WithLabelValues(id, "image", "").Set(float64(st.Images))
	for lvl, n := range st.ByLevel {
		m.layers.WithLabelValues(id, "delta", strconv.Itoa(lvl)).Set(float64(n))
	}
	l := t.LSNs()
	m.lastRecord.WithLabelValues(id).Set(float64(l.LastRecord))
	m.ingestLag.WithLabelValues(id).Set(float64(int64(l.Commit) - int64(l.LastRecord)))
	m.uploadLag.WithLabelValues(id).Set(float64(int64(l.LastRecord) - int64(l.RemoteConsistent)))
	m.pending.WithLabelValues(id).Set(float64(l.Pending))
	m.history.WithLabelValues(id).Set(float64(int64(l.LastRecord) - int64(l.GCCutoff)))
	m.leases.WithLabelValues(id).Set(float64(l.Leases))
}
