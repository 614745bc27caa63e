package safekeeper

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	strmetrics "github.com/stratadb/strata/core/metrics"
	"github.com/stratadb/strata/sdk/pg"
)

// metrics are a safekeeper's Prometheus series, labelled by safekeeper ID.
type metrics struct {
	flushLSN    prometheus.Gauge
	commitLSN   prometheus.Gauge
	lagBytes    prometheus.Gauge
	archivedLSN prometheus.Gauge
	archiveLag  prometheus.Gauge
	partialLSN  prometheus.Gauge
	fsync       prometheus.Histogram
	bytesIn     prometheus.Counter
	bytesOut    prometheus.Counter
	term        prometheus.Gauge
	diskFull    prometheus.Gauge
	slowRaw     prometheus.Counter
	peerPolls   prometheus.Counter
	fromArchive prometheus.Counter

	consumersExpired prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, id, dataDir string) *metrics {
	c := prometheus.Labels{"safekeeper": id}
	m := &metrics{
		flushLSN: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_flush_lsn",
			Help: "End of the durable local WAL (as a byte position).", ConstLabels: c}),
		commitLSN: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_commit_lsn",
			Help: "Highest LSN known to be durable on a quorum of safekeepers.", ConstLabels: c}),
		lagBytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_lag_bytes",
			Help: "Bytes of WAL Postgres has that this safekeeper has not flushed.", ConstLabels: c}),
		archivedLSN: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_archived_lsn",
			Help: "All WAL below this LSN is in the object store.", ConstLabels: c}),
		archiveLag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_archive_lag_bytes",
			Help: "Flushed WAL bytes not yet archived.", ConstLabels: c}),
		partialLSN: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_archive_partial_lsn",
			Help: "End of the partial last segment this safekeeper last put into the object store (0: none yet).", ConstLabels: c}),
		fsync: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "strata_safekeeper_fsync_seconds",
			Help: "Duration of group-commit flushes (data and checksum fdatasync).", ConstLabels: c,
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		bytesIn: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_safekeeper_received_bytes_total",
			Help: "WAL bytes flushed from Postgres.", ConstLabels: c}),
		bytesOut: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_safekeeper_sent_bytes_total",
			Help: "WAL bytes sent to consumers and peers.", ConstLabels: c}),
		term: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_term",
			Help: "Current election term.", ConstLabels: c}),
		diskFull: prometheus.NewGauge(prometheus.GaugeOpts{Name: "strata_safekeeper_disk_full",
			Help: "1 while WAL cannot be stored because the data folder's disk is full (the quorum goes on without this safekeeper), else 0.", ConstLabels: c}),
		slowRaw: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_safekeeper_slow_raw_syscalls_total",
			Help: "Raw WAL-path system calls that took longer than 100 ms; each sends the next 10 s of calls the usual way (raw_syscalls).", ConstLabels: c}),
		peerPolls: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_safekeeper_peer_poll_rounds_total",
			Help: "Rounds of status calls to the peers (for the commit LSN); one per flush of this node's at most, else every 50 ms while its flushed WAL is not known committed, else every second.", ConstLabels: c}),
		fromArchive: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_safekeeper_archive_read_bytes_total",
			Help: "Archived WAL read back to stream WAL this safekeeper removed (to a pageserver resuming below its start LSN).", ConstLabels: c}),
		consumersExpired: prometheus.NewCounter(prometheus.CounterOpts{Name: "strata_safekeeper_consumers_expired_total",
			Help: "WAL consumers forgotten after staying behind the commit LSN without progress for archive.consumer_expiry (they no longer hold local WAL).", ConstLabels: c}),
	}
	free := strmetrics.NewDiskFree("strata_safekeeper_disk_free_bytes",
		"Bytes free on the data folder's filesystem (read at each scrape): alert before strata_safekeeper_disk_full.", dataDir, c)
	if reg != nil {
		for _, col := range []prometheus.Collector{m.flushLSN, m.commitLSN, m.lagBytes, m.archivedLSN, m.archiveLag, m.partialLSN, m.fsync, m.bytesIn, m.bytesOut, m.term, m.diskFull, m.slowRaw, m.peerPolls, m.fromArchive, m.consumersExpired, free} {
			reg.MustRegister(col)
		}
	}
	return m
}

func (m *metrics) observeFsync(d time.Duration) { m.fsync.Observe(d.Seconds()) }

func lsnFloat(l pg.LSN) float64 { return float64(l) }
