package loadgen

import (
	"context"
	"fmt"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/client"
)

func startLocal(tb testing.TB, o LocalOptions) (*Local, *client.Client) {
	tb.Helper()
	o.Dir = tb.TempDir()
	l, err := StartLocal(context.Background(), o, zerolog.Nop())
	if err != nil {
		tb.Fatal(err)
	}
	c, err := client.Dial(l.Addr)
	if err != nil {
		l.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close(); l.Close() })
	return l, c
}

// TestModes runs each mode against an in-process pageserver and checks,
// through the pageserver's own metrics, that cached reads are cache hits,
// uncached reads are not, and cold reads download layers.
func TestModes(t *testing.T) {
	ctx := context.Background()
	l, c := startLocal(t, LocalOptions{LayerTargetSize: 64 << 10, Evictable: true})
	cfg := Config{Pages: 300, Clients: 4}
	if err := Setup(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	if err := l.Flush(ctx, DefaultTimeline); err != nil {
		t.Fatal(err)
	}
	check := func(r Result, n int64) {
		t.Helper()
		if r.Requests != n || r.Errors != 0 {
			t.Fatalf("%s: %d requests, %d errors, want %d and 0", r.Mode, r.Requests, r.Errors, n)
		}
		if r.P50 <= 0 || r.P50 > r.P99 || r.P99 > r.Max || r.PagesPerSec <= 0 || r.Hist.TotalCount() != n {
			t.Fatalf("%s: inconsistent figures %s (histogram %d)", r.Mode, r, r.Hist.TotalCount())
		}
		t.Log(r)
	}

	cfg.Mode, cfg.Requests = Cached, 2000
	hits0 := l.Counter("strata_pageserver_cache_hits_total")
	r, err := Run(ctx, c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	check(r, 2000)
	if hits := l.Counter("strata_pageserver_cache_hits_total") - hits0; hits < 2000 {
		t.Fatalf("cached run: %v cache hits for 2000 reads", hits)
	}

	cfg.Mode, cfg.Requests = Uncached, 1000
	hits0, reads0 := l.Counter("strata_pageserver_cache_hits_total"), l.Counter("strata_pageserver_reads_total")
	if r, err = Run(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	check(r, 1000)
	hits, reads := l.Counter("strata_pageserver_cache_hits_total")-hits0, l.Counter("strata_pageserver_reads_total")-reads0
	if reads < 1000 || hits > 10 {
		t.Fatalf("uncached run: %v reads, %v of them cache hits", reads, hits)
	}

	n, err := l.Evict(ctx, DefaultTimeline)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Mode, cfg.Requests = Cold, 0
	down0 := l.Counter("strata_pageserver_downloaded_bytes_total")
	if r, err = Run(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	check(r, 300) // one pass over the working set
	if down := l.Counter("strata_pageserver_downloaded_bytes_total") - down0; down < 300*8192 {
		t.Fatalf("cold run after evicting %d layers downloaded %v bytes", n, down)
	}
}

// TestWrongData checks that a page with other bytes counts as an error.
func TestWrongData(t *testing.T) {
	ctx := context.Background()
	_, c := startLocal(t, LocalOptions{})
	cfg := Config{Pages: 8, Clients: 2, Requests: 50}
	if err := Setup(ctx, c, cfg); err != nil {
		t.Fatal(err)
	}
	// Overwrite block 3's newest version with the old bytes.
	if _, err := c.PutPages(ctx, DefaultTimeline, []client.PageWrite{{Page: DefaultRel.Page(3), W: NewW + 1, Data: PageData(3, 0)}}); err != nil {
		t.Fatal(err)
	}
	if err := c.AdvanceCommitLSN(ctx, DefaultTimeline, NewW+1); err != nil {
		t.Fatal(err)
	}
	if _, err := Run(ctx, c, cfg); err == nil {
		t.Fatal("warm-up accepted a wrong page")
	}
	cfg.Mode = Uncached // the old version is still right at ReadOldLSN
	r, err := Run(ctx, c, cfg)
	if err != nil || r.Errors != 0 {
		t.Fatalf("uncached run: %v, %v", r, err)
	}
}

// BenchmarkGetPage measures GetPage over loopback gRPC against an
// in-process pageserver with 1 and 16 clients, from the page cache and
// from local layer files; it reports p50/p99/p99.9 in microseconds.
func BenchmarkGetPage(b *testing.B) {
	ctx := context.Background()
	l, c := startLocal(b, LocalOptions{})
	base := Config{Pages: 4096}
	if err := Setup(ctx, c, base); err != nil {
		b.Fatal(err)
	}
	if err := l.Flush(ctx, DefaultTimeline); err != nil {
		b.Fatal(err)
	}
	for _, m := range []Mode{Cached, Uncached} {
		for _, clients := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/clients=%d", m, clients), func(b *testing.B) {
				cfg := base
				cfg.Mode, cfg.Clients, cfg.Requests = m, clients, int64(b.N)
				b.ResetTimer()
				r, err := Run(ctx, c, cfg)
				if err != nil {
					b.Fatal(err)
				}
				if r.Errors != 0 {
					b.Fatalf("%d errors", r.Errors)
				}
				b.ReportMetric(float64(r.P50.Nanoseconds())/1e3, "p50_us")
				b.ReportMetric(float64(r.P99.Nanoseconds())/1e3, "p99_us")
				b.ReportMetric(float64(r.P999.Nanoseconds())/1e3, "p99.9_us")
				b.ReportMetric(r.PagesPerSec, "pages/s")
			})
		}
	}
}
