package fusefs

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// BenchmarkRead8K reads random 8 KiB pages of a 1,024-page relation file
// through the mount (direct I/O: every read is a FUSE request), served from
// the in-memory Backend with no cache tier, and reports p50/p99 latency.
//
//	go test -run XXX -bench Read8K -benchtime 20000x ./core/compute/fusefs/
func BenchmarkRead8K(b *testing.B) {
	for _, tc := range []struct {
		name  string
		cache bool
	}{{"backend", false}, {"memcache", true}} {
		b.Run(tc.name, func(b *testing.B) {
			e := newEnv(b)
			var c Cache
			if tc.cache {
				c = NewMemCache(2048)
			}
			e.mount(b, NewMemory(), c)
			if err := os.MkdirAll(filepath.Join(e.mnt, "base/5"), 0o700); err != nil {
				b.Fatal(err)
			}
			p := filepath.Join(e.mnt, "base/5/16384")
			const pages = 1024
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			buf := make([]byte, pg.BlockSize)
			for i := 0; i < pages; i++ {
				buf[0] = byte(i)
				if _, err := f.WriteAt(buf, int64(i)*pg.BlockSize); err != nil {
					b.Fatal(err)
				}
			}
			lat := make([]time.Duration, 0, b.N)
			rng := rand.New(rand.NewPCG(1, 2))
			b.SetBytes(pg.BlockSize)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				blk := rng.IntN(pages)
				t := time.Now()
				if _, err := f.ReadAt(buf, int64(blk)*pg.BlockSize); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(t))
				if buf[0] != byte(blk) {
					b.Fatalf("block %d read %d", blk, buf[0])
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
		})
	}
}

// BenchmarkWrite8K overwrites random pages of a 1,024-page relation file
// through the mount and reports p50/p99 latency.
func BenchmarkWrite8K(b *testing.B) {
	e := newEnv(b)
	e.mount(b, NewMemory(), nil)
	if err := os.MkdirAll(filepath.Join(e.mnt, "base/5"), 0o700); err != nil {
		b.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(e.mnt, "base/5/16384"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	const pages = 1024
	buf := make([]byte, pg.BlockSize)
	if _, err := f.WriteAt(buf, (pages-1)*pg.BlockSize); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	rng := rand.New(rand.NewPCG(3, 4))
	b.SetBytes(pg.BlockSize)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		if _, err := f.WriteAt(buf, int64(rng.IntN(pages))*pg.BlockSize); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-us")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-us")
}
