package pluginhost

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
)

// The cost of crossing the plugin boundary: the same calls on the Memory
// store in process and behind the example plugin (a subprocess over gRPC
// with mTLS on a Unix socket).
//
//	go test -run '^$' -bench . -benchtime 2s ./core/pluginhost

func benchStores(b *testing.B) map[string]func(b *testing.B) objectstore.Store {
	return map[string]func(b *testing.B) objectstore.Store{
		"inprocess": func(b *testing.B) objectstore.Store { return objectstore.NewMemory() },
		"external": func(b *testing.B) objectstore.Store {
			path, sum := buildPlugin(b, "objectstore-memory")
			return openExternal(b, Spec{Name: "bench", Path: path, SHA256: sum})
		},
	}
}

func forEachStore(b *testing.B, fn func(b *testing.B, st objectstore.Store)) {
	for _, name := range []string{"inprocess", "external"} {
		open := benchStores(b)[name]
		b.Run(name, func(b *testing.B) {
			st := open(b)
			defer st.Close()
			fn(b, st)
		})
	}
}

func BenchmarkStat(b *testing.B) {
	forEachStore(b, func(b *testing.B, st objectstore.Store) {
		ctx := context.Background()
		if err := st.Put(ctx, "k", bytes.NewReader(make([]byte, 8192)), objectstore.PutOptions{Size: 8192}); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := st.Stat(ctx, "k"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkGet8K(b *testing.B) {
	forEachStore(b, func(b *testing.B, st objectstore.Store) {
		ctx := context.Background()
		if err := st.Put(ctx, "k", bytes.NewReader(make([]byte, 8192)), objectstore.PutOptions{Size: 8192}); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 8192)
		b.SetBytes(8192)
		b.ReportAllocs()
		for b.Loop() {
			rc, err := st.Get(ctx, "k")
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(rc, buf); err != nil {
				b.Fatal(err)
			}
			rc.Close()
		}
	})
}

func BenchmarkPut8K(b *testing.B) {
	forEachStore(b, func(b *testing.B, st objectstore.Store) {
		ctx := context.Background()
		data := make([]byte, 8192)
		r := bytes.NewReader(data)
		b.SetBytes(8192)
		b.ReportAllocs()
		for b.Loop() {
			r.Reset(data)
			if err := st.Put(ctx, "k", r, objectstore.PutOptions{Size: 8192}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkStatParallel is Stat from many goroutines at once: the host
// multiplexes them over one connection.
func BenchmarkStatParallel(b *testing.B) {
	forEachStore(b, func(b *testing.B, st objectstore.Store) {
		ctx := context.Background()
		if err := st.Put(ctx, "k", bytes.NewReader([]byte("x")), objectstore.PutOptions{Size: 1}); err != nil {
			b.Fatal(err)
		}
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := st.Stat(ctx, "k"); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkPut16M and BenchmarkGet16M measure streaming throughput (MB/s)
// with a source and sink that cost nothing.
func BenchmarkPut16M(b *testing.B) {
	forEachStore(b, func(b *testing.B, st objectstore.Store) {
		ctx := context.Background()
		data := make([]byte, 16<<20)
		r := bytes.NewReader(data)
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			r.Reset(data)
			if err := st.Put(ctx, "k", r, objectstore.PutOptions{Size: int64(len(data))}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkGet16M(b *testing.B) {
	forEachStore(b, func(b *testing.B, st objectstore.Store) {
		ctx := context.Background()
		const size = 16 << 20
		if err := st.Put(ctx, "k", bytes.NewReader(make([]byte, size)), objectstore.PutOptions{Size: size}); err != nil {
			b.Fatal(err)
		}
		buf := make([]byte, 256<<10)
		b.SetBytes(size)
		for b.Loop() {
			rc, err := st.Get(ctx, "k")
			if err != nil {
				b.Fatal(err)
			}
			n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{rc}, buf)
			rc.Close()
			if err != nil || n != size {
				b.Fatalf("read %d bytes: %v", n, err)
			}
		}
	})
}
