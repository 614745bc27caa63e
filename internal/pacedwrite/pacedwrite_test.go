package pacedwrite

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratadb/strata/internal/smallfs"
)

// TestWritesEveryByte writes random amounts through a Writer with a small
// chunk, after a prefix written without it, and reads the file back; the
// writer has handed every whole chunk to writeback and no more.
func TestWritesEveryByte(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, prefix := range []int{0, 1000} {
		t.Run(fmt.Sprintf("prefix=%d", prefix), func(t *testing.T) {
			f, err := os.Create(filepath.Join(t.TempDir(), "f"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want := make([]byte, prefix)
			if _, err := f.Write(want); err != nil {
				t.Fatal(err)
			}
			const chunk = 64 << 10
			w := newChunk(f, chunk)
			for len(want) < prefix+20*chunk {
				p := make([]byte, 1+rng.IntN(3*chunk))
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				n, err := w.Write(p)
				if err != nil || n != len(p) {
					t.Fatalf("Write(%d bytes) = %d, %v", len(p), n, err)
				}
				want = append(want, p...)
				if w.plain {
					t.Fatal("a file on the test's folder was not paced")
				}
				if got, wantSent := w.sent, (w.n/chunk)*chunk; got != wantSent {
					t.Fatalf("after %d bytes %d handed to writeback, want %d", w.n, got, wantSent)
				}
			}
			got, err := os.ReadFile(f.Name())
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("file has %d bytes, not the %d written", len(got), len(want))
			}
		})
	}
}

// TestPipeIsPlain: a file that cannot be paced is written as it is.
func TestPipeIsPlain(t *testing.T) {
	r, wf, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w := newChunk(wf, 16)
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	want := bytes.Repeat([]byte("strata"), 100)
	if _, err := w.Write(want); err != nil {
		t.Fatal(err)
	}
	wf.Close()
	if got := <-done; !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes through the pipe, want %d", len(got), len(want))
	}
	if !w.plain {
		t.Fatal("a pipe was paced")
	}
}

// TestFullDisk: a write the disk has no room for fails with ENOSPC.
func TestFullDisk(t *testing.T) {
	dir := smallfs.Mount(t, 1<<20)
	f, err := os.Create(filepath.Join(dir, "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := newChunk(f, 64<<10)
	p := make([]byte, 64<<10)
	for i := 0; ; i++ {
		if _, err = w.Write(p); err != nil {
			break
		}
		if i > 32 {
			t.Fatal("2 MiB written into a 1 MiB filesystem")
		}
	}
	if !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("write into a full filesystem: %v, want ENOSPC", err)
	}
}

// BenchmarkCommitUnderBulkWrite measures what a bulk writer does to a
// small synchronous writer on the same disk: a "committer" writes 3 KB and
// fdatasyncs every 2 ms (a safekeeper's WAL flush) while ten 75 MB files
// are written and fsynced (a pageserver's image layers), plain or paced.
// It reports the committer's p99 and longest flush and the bulk writer's
// MB/s. The folder is STRATA_BENCH_DIR or the system's temporary folder:
// put it on the disk to measure (a tmpfs measures nothing).
//
//	go test ./internal/pacedwrite -run XXX -bench CommitUnderBulkWrite -benchtime 3x
func BenchmarkCommitUnderBulkWrite(b *testing.B) {
	base := os.Getenv("STRATA_BENCH_DIR")
	if base == "" {
		base = os.TempDir()
	}
	for _, paced := range []bool{false, true} {
		b.Run(fmt.Sprintf("paced=%v", paced), func(b *testing.B) {
			dir, err := os.MkdirTemp(base, "pacedwrite-bench-")
			if err != nil {
				b.Fatal(err)
			}
			defer os.RemoveAll(dir)
			var lat []time.Duration
			var bulk time.Duration
			for i := 0; i < b.N; i++ {
				l, d := commitUnderBulk(b, dir, paced)
				lat = append(lat, l...)
				bulk += d
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "commit-p99-ms")
			b.ReportMetric(float64(lat[len(lat)-1])/1e6, "commit-max-ms")
			b.ReportMetric(float64(b.N)*750/bulk.Seconds(), "bulk-MB/s")
		})
	}
}

func commitUnderBulk(b *testing.B, dir string, paced bool) ([]time.Duration, time.Duration) {
	cf, err := os.Create(filepath.Join(dir, "commit"))
	if err != nil {
		b.Fatal(err)
	}
	defer cf.Close()
	stop := make(chan struct{})
	var lat []time.Duration
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rec := make([]byte, 3000)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := cf.Write(rec); err != nil {
				b.Error(err)
				return
			}
			t := time.Now()
			if err := unix.Fdatasync(int(cf.Fd())); err != nil {
				b.Error(err)
				return
			}
			lat = append(lat, time.Since(t))
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(200 * time.Millisecond)
	block := make([]byte, 256<<10)
	for i := range block {
		block[i] = byte(i * 7)
	}
	t0 := time.Now()
	for i := 0; i < 10; i++ {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("bulk%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		var w io.Writer = f
		if paced {
			w = New(f)
		}
		for n := 0; n < 75<<20; n += len(block) {
			if _, err := w.Write(block); err != nil {
				b.Fatal(err)
			}
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	bulk := time.Since(t0)
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()
	for i := 0; i < 10; i++ {
		os.Remove(filepath.Join(dir, fmt.Sprintf("bulk%d", i)))
	}
	return lat, bulk
}
