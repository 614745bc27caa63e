package client_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/sdk/pg"
)

// BenchmarkGetPageCached measures GetPage of cached pages over loopback
// gRPC, one page per call, and reports p50/p99 latency in microseconds.
func BenchmarkGetPageCached(b *testing.B) {
	ctx := context.Background()
	h := start(b, b.TempDir(), nil)
	if _, err := h.c.CreateTimeline(ctx, tl); err != nil {
		b.Fatal(err)
	}
	var ws []client.PageWrite
	for i := uint32(0); i < 256; i++ {
		ws = append(ws, client.PageWrite{Page: rel.Page(i), W: 100, Data: page(byte(i))})
	}
	if _, err := h.c.PutPages(ctx, tl, ws); err != nil {
		b.Fatal(err)
	}
	_ = h.c.AdvanceCommitLSN(ctx, tl, 100)
	for i := uint32(0); i < 256; i++ { // warm the cache
		if _, err := h.c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(i), RequestLSN: client.LatestLSN}); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(pg.BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := h.c.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(uint32(i % 256)), RequestLSN: client.LatestLSN}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50_us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99_us")
}

// BenchmarkGetPageBatch32 measures batched GetPage (32 pages per batch)
// throughput over loopback gRPC.
func BenchmarkGetPageBatch32(b *testing.B) {
	ctx := context.Background()
	h := start(b, b.TempDir(), nil)
	_, _ = h.c.CreateTimeline(ctx, tl)
	var ws []client.PageWrite
	for i := uint32(0); i < 256; i++ {
		ws = append(ws, client.PageWrite{Page: rel.Page(i), W: 100, Data: page(byte(i))})
	}
	_, _ = h.c.PutPages(ctx, tl, ws)
	_ = h.c.AdvanceCommitLSN(ctx, tl, 100)
	reqs := make([]client.PageRequest, 32)
	b.SetBytes(32 * pg.BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range reqs {
			reqs[j] = client.PageRequest{Page: rel.Page(uint32((i*32 + j) % 256)), RequestLSN: client.LatestLSN}
		}
		res, err := h.c.GetPages(ctx, tl, reqs)
		if err != nil || res[0].Err != nil {
			b.Fatal(err)
		}
	}
}
