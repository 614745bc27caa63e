package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/objectstore"
)

// heapWatch samples the Go heap while a big object streams and reports the
// largest growth over the baseline.
type heapWatch struct {
	base uint64
	max  uint64
	stop chan struct{}
	done sync.WaitGroup
}

func startHeapWatch() *heapWatch {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	h := &heapWatch{base: ms.HeapAlloc, max: ms.HeapAlloc, stop: make(chan struct{})}
	h.done.Add(1)
	go func() {
		defer h.done.Done()
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-h.stop:
				return
			case <-tick.C:
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				h.max = max(h.max, ms.HeapAlloc)
			}
		}
	}()
	return h
}

// growth stops the watch and returns the peak growth in bytes.
func (h *heapWatch) growth() int64 {
	close(h.stop)
	h.done.Wait()
	return int64(h.max - h.base)
}

// hashingReader hashes what it yields.
type hashingReader struct {
	r io.Reader
	h io.Writer
}

func (h hashingReader) Read(b []byte) (int, error) {
	n, err := h.r.Read(b)
	h.h.Write(b[:n])
	return n, err
}

func (s *suite) testBig(t *testing.T) {
	size := s.opts.BigSize
	if size < 0 {
		t.Skip("BigSize < 0: big object test disabled")
	}
	st := s.store(t)
	ctx := context.Background()
	p := Pattern{Seed: 256}
	key := "big/object"

	var watch *heapWatch
	if s.opts.BigHeapLimit > 0 {
		watch = startHeapWatch()
	}
	wh := sha256.New()
	start := time.Now()
	if err := st.Put(ctx, key, hashingReader{p.Reader(size), wh}, objectstore.PutOptions{Size: size}); err != nil {
		t.Fatalf("Put of a %d MiB streamed object: %v", size>>20, err)
	}
	putDur := time.Since(start)
	want := wh.Sum(nil)

	info, err := st.Stat(ctx, key)
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if info.Size != size {
		t.Fatalf("Stat: Size %d, want %d", info.Size, size)
	}

	start = time.Now()
	rc, err := st.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	rh := sha256.New()
	n, err := io.Copy(rh, rc)
	if cerr := rc.Close(); cerr != nil {
		t.Errorf("closing the reader: %v", cerr)
	}
	if err != nil {
		t.Fatalf("reading back after %d bytes: %v", n, err)
	}
	getDur := time.Since(start)
	if n != size || !bytes.Equal(rh.Sum(nil), want) {
		t.Fatalf("read back %d bytes with SHA-256 %x, want %d bytes with SHA-256 %x", n, rh.Sum(nil), size, want)
	}
	if watch != nil {
		if g := watch.growth(); g > s.opts.BigHeapLimit {
			t.Fatalf("heap grew by %d MiB while streaming a %d MiB object (limit %d MiB): the store buffers objects",
				g>>20, size>>20, s.opts.BigHeapLimit>>20)
		}
	}
	t.Logf("%d MiB: put %v (%.0f MiB/s), get %v (%.0f MiB/s)", size>>20,
		putDur.Round(time.Millisecond), float64(size>>20)/putDur.Seconds(),
		getDur.Round(time.Millisecond), float64(size>>20)/getDur.Seconds())

	// Ranges deep inside and at the end of the big object.
	for _, r := range [][2]int64{{size / 2, 1 << 20}, {size - 1000, 5000}, {size/3 + 7, 12345}} {
		got := getRange(t, st, key, r[0], r[1])
		wantLen := min(r[1], size-r[0])
		wantBytes(t, fmt.Sprintf("GetRange(big, %d, %d)", r[0], r[1]), got, p.Bytes(r[0], wantLen))
	}
	if err := st.Delete(ctx, key); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}
