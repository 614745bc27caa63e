package objectstore

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric names registered by WithMetrics. Every series carries a "store"
// label with the name given to WithMetrics.
const (
	metricOps          = "strata_objectstore_operations_total"           // by op, result
	metricDuration     = "strata_objectstore_operation_duration_seconds" // by op
	metricBytesRead    = "strata_objectstore_read_bytes_total"
	metricBytesWritten = "strata_objectstore_written_bytes_total"
)

// Result label values of strata_objectstore_operations_total.
const (
	resultOK         = "ok"
	resultNotFound   = "not_found"
	resultExists     = "exists"
	resultInvalid    = "invalid"
	resultTransient  = "transient"
	resultCanceled   = "canceled"
	resultError      = "error"
	resultClosed     = "closed"
	resultBadRange   = "invalid_range"
	resultCallbackEr = "callback_error"
)

type storeMetrics struct {
	ops      *prometheus.CounterVec
	duration *prometheus.HistogramVec
	read     prometheus.Counter
	written  prometheus.Counter
}

// WithMetrics returns a Store that counts the calls to s in reg:
//
//   - strata_objectstore_operations_total{store, op, result}: calls by
//     operation (put, get, get_range, stat, list, delete) and result (ok,
//     not_found, exists, invalid, invalid_range, transient, canceled,
//     closed, error; callback_error for a List stopped by its callback);
//   - strata_objectstore_operation_duration_seconds{store, op}: latency of
//     the call (for get and get_range, until the reader is returned, the
//     time to first byte; for put, the whole upload);
//   - strata_objectstore_read_bytes_total{store} and
//     strata_objectstore_written_bytes_total{store}: bytes streamed out of
//     Get/GetRange readers and into successful Puts.
//
// store names the backend in the "store" label, so that several stores can
// share reg. Wrapping twice with the same reg and store name shares the
// series. Closing the returned store closes s.
func WithMetrics(s Store, reg prometheus.Registerer, store string) Store {
	labels := prometheus.Labels{"store": store}
	m := &storeMetrics{
		ops: register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: metricOps, Help: "Object store calls by operation and result.", ConstLabels: labels,
		}, []string{"op", "result"})),
		duration: register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: metricDuration, Help: "Object store call latency by operation (to first byte for reads).",
			ConstLabels: labels, Buckets: prometheus.ExponentialBuckets(0.0001, 4, 11), // 100us .. ~105s
		}, []string{"op"})),
		read: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricBytesRead, Help: "Bytes read from the object store.", ConstLabels: labels,
		})),
		written: register(reg, prometheus.NewCounter(prometheus.CounterOpts{
			Name: metricBytesWritten, Help: "Bytes written to the object store by successful puts.", ConstLabels: labels,
		})),
	}
	return &metricsStore{s: s, m: m}
}

// register registers c, or returns the collector already registered under
// the same description.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic("objectstore: registering metrics: " + err.Error())
	}
	return c
}

func resultOf(err error) string {
	switch {
	case err == nil:
		return resultOK
	case errors.Is(err, ErrNotFound):
		return resultNotFound
	case errors.Is(err, ErrExists):
		return resultExists
	case errors.Is(err, ErrInvalidKey):
		return resultInvalid
	case errors.Is(err, ErrInvalidRange):
		return resultBadRange
	case errors.Is(err, ErrClosed):
		return resultClosed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return resultCanceled
	case errors.Is(err, ErrTransient):
		return resultTransient
	default:
		return resultError
	}
}

type metricsStore struct {
	s Store
	m *storeMetrics
}

var _ Store = (*metricsStore)(nil)

func (ms *metricsStore) observe(op string, start time.Time, err error) {
	ms.m.ops.WithLabelValues(op, resultOf(err)).Inc()
	ms.m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (ms *metricsStore) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) error {
	start := time.Now()
	cr := &countingReader{r: r}
	var err error
	if sk, ok := r.(io.ReadSeeker); ok {
		// Keep the reader seekable for a retry wrapper below this one.
		err = ms.s.Put(ctx, key, &countingReadSeeker{countingReader: cr, sk: sk}, opts)
	} else {
		err = ms.s.Put(ctx, key, cr, opts)
	}
	ms.observe("put", start, err)
	if err == nil {
		ms.m.written.Add(float64(cr.n))
	}
	return err
}

func (ms *metricsStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := ms.s.Get(ctx, key)
	ms.observe("get", start, err)
	if err != nil {
		return nil, err
	}
	return &meteredReader{rc: rc, c: ms.m.read}, nil
}

func (ms *metricsStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	start := time.Now()
	rc, err := ms.s.GetRange(ctx, key, off, length)
	ms.observe("get_range", start, err)
	if err != nil {
		return nil, err
	}
	return &meteredReader{rc: rc, c: ms.m.read}, nil
}

func (ms *metricsStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	start := time.Now()
	info, err := ms.s.Stat(ctx, key)
	ms.observe("stat", start, err)
	return info, err
}

func (ms *metricsStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	start := time.Now()
	var fnErr error
	err := ms.s.List(ctx, prefix, func(info ObjectInfo) error {
		fnErr = fn(info)
		return fnErr
	})
	if err != nil && fnErr != nil && errors.Is(err, fnErr) {
		ms.m.ops.WithLabelValues("list", resultCallbackEr).Inc()
		ms.m.duration.WithLabelValues("list").Observe(time.Since(start).Seconds())
		return err
	}
	ms.observe("list", start, err)
	return err
}

func (ms *metricsStore) Delete(ctx context.Context, key string) error {
	start := time.Now()
	err := ms.s.Delete(ctx, key)
	ms.observe("delete", start, err)
	return err
}

func (ms *metricsStore) Close() error { return ms.s.Close() }

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// countingReadSeeker counts the bytes of the last pass only: a seek back to
// the start (a retry) resets the count.
type countingReadSeeker struct {
	*countingReader
	sk io.Seeker
}

func (c *countingReadSeeker) Seek(off int64, whence int) (int64, error) {
	pos, err := c.sk.Seek(off, whence)
	if err == nil {
		c.n = 0
	}
	return pos, err
}

// meteredReader adds the bytes read to a counter, in batches.
type meteredReader struct {
	rc      io.ReadCloser
	c       prometheus.Counter
	mu      sync.Mutex
	pending int64
}

func (m *meteredReader) Read(p []byte) (int, error) {
	n, err := m.rc.Read(p)
	if n > 0 {
		m.mu.Lock()
		m.pending += int64(n)
		if m.pending >= 1<<20 || err != nil {
			m.c.Add(float64(m.pending))
			m.pending = 0
		}
		m.mu.Unlock()
	} else if err != nil {
		m.flush()
	}
	return n, err
}

func (m *meteredReader) flush() {
	m.mu.Lock()
	if m.pending > 0 {
		m.c.Add(float64(m.pending))
		m.pending = 0
	}
	m.mu.Unlock()
}

func (m *meteredReader) Close() error {
	m.flush()
	return m.rc.Close()
}
