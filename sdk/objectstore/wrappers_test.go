package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// fastRetry keeps retried tests quick.
var fastRetry = objectstore.RetryPolicy{MaxAttempts: 8, InitialBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}

func TestPrefixAcceptance(t *testing.T) {
	const prefix = "tenants/t1/"
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		inner := objectstore.NewMemory()
		// An object outside the prefix that the prefixed store must not see.
		if err := inner.Put(context.Background(), "tenants/t2/x", strings.NewReader("x"), objectstore.PutOptions{Size: 1}); err != nil {
			t.Fatal(err)
		}
		return objectstore.WithPrefix(inner, prefix)
	}, storetest.Options{StrictClose: true, MaxKeyLen: objectstore.MaxKeyLen - len(prefix), BigSize: 32 << 20})
}

func TestRetryMetricsAcceptance(t *testing.T) {
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		reg := prometheus.NewRegistry()
		return objectstore.WithRetry(objectstore.WithMetrics(objectstore.NewMemory(), reg, "memory"), fastRetry, zerolog.Nop())
	}, storetest.Options{StrictClose: true, BigSize: 32 << 20})
}

// TestRetryOverFaultyAcceptance runs the suite through a store that fails
// one call in ten transiently (and one listing in five half-way): the retry
// wrapper must hide every failure. Reads that fail mid-stream are not
// injected: the suite overwrites keys, and resuming a read
// (RetryPolicy.ResumeReads) is only safe for keys that are never
// overwritten (see TestRetryResumeReads in package faulty).
func TestRetryOverFaultyAcceptance(t *testing.T) {
	var stores []*faulty.Store
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		f := faulty.New(objectstore.NewMemory(), faulty.Config{Seed: uint64(len(stores)), Rules: []faulty.Rule{
			{Fault: faulty.FailCall, Transient: true, Probability: 0.1},
			{Ops: faulty.OpList, Fault: faulty.FailStream, Transient: true, After: 3, Probability: 0.2},
		}})
		stores = append(stores, f)
		return objectstore.WithRetry(f, fastRetry, zerolog.Nop())
	}, storetest.Options{StrictClose: true, BigSize: 8 << 20})
	fired := 0
	for _, f := range stores {
		fired += f.Fired()
	}
	// The whole suite makes thousands of calls: a tenth of them must have
	// failed (unless -run picked a few subtests).
	if flag.Lookup("test.run").Value.String() == "" && fired < 100 {
		t.Fatalf("only %d faults were injected: the test does not test retries", fired)
	}
	t.Logf("%d faults injected and retried over %d stores", fired, len(stores))
}

func TestPrefixIsolation(t *testing.T) {
	ctx := context.Background()
	inner := objectstore.NewMemory()
	a := objectstore.WithPrefix(inner, "a")
	b := objectstore.WithPrefix(inner, "a/") // same prefix spelled differently
	c := objectstore.WithPrefix(inner, "ab")
	if err := a.Put(ctx, "k", strings.NewReader("1"), objectstore.PutOptions{Size: 1}); err != nil {
		t.Fatal(err)
	}
	if err := c.Put(ctx, "k", strings.NewReader("2"), objectstore.PutOptions{Size: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := inner.Stat(ctx, "a/k"); err != nil {
		t.Fatalf("the inner store does not hold a/k: %v", err)
	}
	info, err := b.Stat(ctx, "k")
	if err != nil || info.Key != "k" {
		t.Fatalf("Stat through the prefix = %+v, %v; want key \"k\"", info, err)
	}
	var keys []string
	if err := a.List(ctx, "", func(oi objectstore.ObjectInfo) error { keys = append(keys, oi.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "k" {
		t.Fatalf("List through prefix \"a\" = %q, want [k] (not ab/k)", keys)
	}
	// A key cannot escape the prefix.
	if err := a.Put(ctx, "../b", strings.NewReader("x"), objectstore.PutOptions{Size: 1}); !errors.Is(err, objectstore.ErrInvalidKey) {
		t.Fatalf("Put(\"../b\") through a prefix: %v, want ErrInvalidKey", err)
	}
	// An invalid prefix fails every call.
	bad := objectstore.WithPrefix(inner, "x/../y")
	if _, err := bad.Stat(ctx, "k"); !errors.Is(err, objectstore.ErrInvalidKey) {
		t.Fatalf("Stat through an invalid prefix: %v, want ErrInvalidKey", err)
	}
	if objectstore.WithPrefix(inner, "") != objectstore.Store(inner) {
		t.Fatal("an empty prefix should return the store itself")
	}
}

func TestMetrics(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	s := objectstore.WithMetrics(objectstore.NewMemory(), reg, "mem")
	// A second wrapper with the same name shares the series.
	s2 := objectstore.WithMetrics(objectstore.NewMemory(), reg, "mem")
	// Another name is a separate series in the same registry.
	other := objectstore.WithMetrics(objectstore.NewMemory(), reg, "other")

	data := bytes.Repeat([]byte("x"), 3000)
	if err := s.Put(ctx, "a", bytes.NewReader(data), objectstore.PutOptions{Size: 3000}); err != nil {
		t.Fatal(err)
	}
	if err := s2.Put(ctx, "a", strings.NewReader("yy"), objectstore.PutOptions{Size: 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "a", strings.NewReader("z"), objectstore.PutOptions{IfNotExists: true, Size: 1}); !errors.Is(err, objectstore.ErrExists) {
		t.Fatalf("conditional put: %v", err)
	}
	rc, err := s.GetRange(ctx, "a", 1000, 500)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(io.Discard, rc); err != nil {
		t.Fatal(err)
	}
	rc.Close()
	if _, err := s.Get(ctx, "missing"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatal(err)
	}
	if _, err := other.Stat(ctx, "missing"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatal(err)
	}
	errStop := errors.New("stop")
	if err := s.List(ctx, "", func(objectstore.ObjectInfo) error { return errStop }); !errors.Is(err, errStop) {
		t.Fatal(err)
	}

	want := `
# HELP strata_objectstore_operations_total Object store calls by operation and result.
# TYPE strata_objectstore_operations_total counter
strata_objectstore_operations_total{op="get",result="not_found",store="mem"} 1
strata_objectstore_operations_total{op="get_range",result="ok",store="mem"} 1
strata_objectstore_operations_total{op="list",result="callback_error",store="mem"} 1
strata_objectstore_operations_total{op="put",result="exists",store="mem"} 1
strata_objectstore_operations_total{op="put",result="ok",store="mem"} 2
strata_objectstore_operations_total{op="stat",result="not_found",store="other"} 1
# HELP strata_objectstore_read_bytes_total Bytes read from the object store.
# TYPE strata_objectstore_read_bytes_total counter
strata_objectstore_read_bytes_total{store="mem"} 500
strata_objectstore_read_bytes_total{store="other"} 0
# HELP strata_objectstore_written_bytes_total Bytes written to the object store by successful puts.
# TYPE strata_objectstore_written_bytes_total counter
strata_objectstore_written_bytes_total{store="mem"} 3002
strata_objectstore_written_bytes_total{store="other"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"strata_objectstore_operations_total", "strata_objectstore_read_bytes_total", "strata_objectstore_written_bytes_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "strata_objectstore_operation_duration_seconds"); n != 5 {
		t.Fatalf("duration histograms: %d series, want 5 (get, get_range, list, put of mem; stat of other)", n)
	}
}
