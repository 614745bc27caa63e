package objectstore_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// go test -run '^$' -bench . ./sdk/objectstore/

func benchPut(b *testing.B, s objectstore.Store) {
	data := bytes.Repeat([]byte{7}, 8<<10)
	ctx := context.Background()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if err := s.Put(ctx, fmt.Sprintf("bench/%08d", i), bytes.NewReader(data), objectstore.PutOptions{Size: int64(len(data))}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkMemoryPut8K(b *testing.B) { benchPut(b, objectstore.NewMemory()) }

// BenchmarkWrappedPut8K measures the cost of the prefix, metrics and retry
// wrappers together over the memory store.
func BenchmarkWrappedPut8K(b *testing.B) {
	s := objectstore.WithRetry(objectstore.WithMetrics(objectstore.WithPrefix(objectstore.NewMemory(), "p"),
		prometheus.NewRegistry(), "mem"), objectstore.DefaultRetryPolicy(), zerolog.Nop())
	benchPut(b, s)
}

func BenchmarkMemoryGet8K(b *testing.B) {
	s := objectstore.NewMemory()
	ctx := context.Background()
	data := bytes.Repeat([]byte{7}, 8<<10)
	for i := 0; i < 256; i++ {
		if err := s.Put(ctx, fmt.Sprintf("bench/%04d", i), bytes.NewReader(data), objectstore.PutOptions{Size: int64(len(data))}); err != nil {
			b.Fatal(err)
		}
	}
	buf := make([]byte, 8<<10)
	b.SetBytes(8 << 10)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rc, err := s.Get(ctx, fmt.Sprintf("bench/%04d", i%256))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(rc, buf); err != nil {
			b.Fatal(err)
		}
		rc.Close()
	}
}
