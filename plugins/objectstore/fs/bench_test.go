package fs

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// go test -run '^$' -bench . -benchtime 2s ./plugins/objectstore/fs/

func benchPut(b *testing.B, cfg Config, size int64) {
	s := open(b, cfg)
	defer s.Close()
	data := storetest.Pattern{Seed: 1}.Bytes(0, size)
	ctx := context.Background()
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Put(ctx, fmt.Sprintf("bench/%08d", i), bytes.NewReader(data), objectstore.PutOptions{Size: size}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFSPut8K(b *testing.B)       { benchPut(b, Config{}, 8<<10) }
func BenchmarkFSPut8KNoSync(b *testing.B) { benchPut(b, Config{NoSync: true}, 8<<10) }
func BenchmarkFSPut4M(b *testing.B)       { benchPut(b, Config{}, 4<<20) }

func benchGet(b *testing.B, ranged bool) {
	s := open(b, Config{NoSync: true})
	defer s.Close()
	ctx := context.Background()
	const objects = 256
	data := storetest.Pattern{Seed: 1}.Bytes(0, 64<<10)
	for i := 0; i < objects; i++ {
		size := int64(8 << 10)
		if ranged {
			size = int64(len(data))
		}
		if err := s.Put(ctx, fmt.Sprintf("bench/%04d", i), bytes.NewReader(data[:size]), objectstore.PutOptions{Size: size}); err != nil {
			b.Fatal(err)
		}
	}
	buf := make([]byte, 8<<10)
	b.SetBytes(8 << 10)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := fmt.Sprintf("bench/%04d", i%objects)
		var rc io.ReadCloser
		var err error
		if ranged {
			rc, err = s.GetRange(ctx, key, int64(i%7)*8<<10, 8<<10)
		} else {
			rc, err = s.Get(ctx, key)
		}
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(rc, buf); err != nil {
			b.Fatal(err)
		}
		rc.Close()
	}
}

func BenchmarkFSGet8K(b *testing.B)      { benchGet(b, false) }
func BenchmarkFSGetRange8K(b *testing.B) { benchGet(b, true) }

func BenchmarkFSList1000(b *testing.B) {
	s := open(b, Config{NoSync: true})
	defer s.Close()
	ctx := context.Background()
	for i := 0; i < 1000; i++ {
		if err := s.Put(ctx, fmt.Sprintf("list/%02d/%04d", i%10, i), bytes.NewReader(nil), objectstore.PutOptions{Size: 0}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		n := 0
		if err := s.List(ctx, "list/", func(objectstore.ObjectInfo) error { n++; return nil }); err != nil || n != 1000 {
			b.Fatalf("List: %d objects, %v", n, err)
		}
	}
}

// BenchmarkFSPut8KParallel: durable 8 KiB puts from 8 goroutines per CPU,
// the shape of many layers or WAL segments uploaded at once.
func BenchmarkFSPut8KParallel(b *testing.B) {
	s := open(b, Config{})
	defer s.Close()
	data := storetest.Pattern{Seed: 1}.Bytes(0, 8<<10)
	var next atomic.Int64
	b.SetBytes(8 << 10)
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := fmt.Sprintf("bench/%08d", next.Add(1))
			if err := s.Put(context.Background(), key, bytes.NewReader(data), objectstore.PutOptions{Size: 8 << 10}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
