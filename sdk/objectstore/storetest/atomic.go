package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/objectstore"
)

// gatedReader yields first, signals reached, waits for release, then
// yields rest.
type gatedReader struct {
	first, rest io.Reader
	reached     chan struct{}
	release     chan struct{}
	once        sync.Once
}

func (g *gatedReader) Read(p []byte) (int, error) {
	n, err := g.first.Read(p)
	if err != io.EOF {
		return n, err
	}
	g.once.Do(func() { close(g.reached) })
	<-g.release
	return g.rest.Read(p)
}

// testPutInProgress checks that readers see the previous state of a key
// while a Put of it is half-way through its body.
func (s *suite) testPutInProgress(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	old := []byte("the previous version")
	put(t, st, "inprogress/existing", old)
	for _, key := range []string{"inprogress/new", "inprogress/existing"} {
		const size = 2 << 20
		p := Pattern{Seed: 77}
		g := &gatedReader{first: bytes.NewReader(p.Bytes(0, 512<<10)), rest: bytes.NewReader(p.Bytes(512<<10, size-512<<10)),
			reached: make(chan struct{}), release: make(chan struct{})}
		done := make(chan error, 1)
		go func() { done <- st.Put(ctx, key, g, objectstore.PutOptions{Size: size}) }()
		select {
		case <-g.reached:
		case err := <-done:
			t.Fatalf("Put(%q) returned %v before reading its whole body", key, err)
		case <-time.After(time.Minute):
			close(g.release)
			t.Fatalf("Put(%q) did not read 512 KiB of its body within a minute", key)
		}
		if key == "inprogress/new" {
			wantNotFound(t, st, key)
			wantKeys(t, "List during the Put of a new key", listKeys(t, st, key), nil)
		} else {
			wantBytes(t, "Get during an overwrite returns the previous version", get(t, st, key), old)
			info, err := st.Stat(ctx, key)
			if err != nil || info.Size != int64(len(old)) {
				t.Fatalf("Stat during an overwrite: %+v, %v; want the previous version's size %d", info, err, len(old))
			}
		}
		close(g.release)
		if err := <-done; err != nil {
			t.Fatalf("Put(%q): %v", key, err)
		}
		wantBytes(t, fmt.Sprintf("Get(%q) after the Put", key), get(t, st, key), p.Bytes(0, size))
	}
}

// testOverwriteAtomic overwrites a key with whole versions while readers
// check that every read returns exactly one complete version.
func (s *suite) testOverwriteAtomic(t *testing.T) {
	st := s.store(t)
	const size = 256 << 10
	const versions = 12
	version := func(v int) []byte { return Pattern{Seed: uint64(1000 + v%3)}.Bytes(0, size) }
	put(t, st, "atomic/key", version(0))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var mu sync.Mutex
	var problems []string
	reads := 0
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				rc, err := st.Get(ctx, "atomic/key")
				var b []byte
				if err == nil {
					b, err = io.ReadAll(rc)
					rc.Close()
				}
				mu.Lock()
				switch {
				case errors.Is(err, context.Canceled):
				case err != nil:
					problems = append(problems, fmt.Sprintf("Get during overwrites: %v", err))
				case !bytes.Equal(b, version(0)) && !bytes.Equal(b, version(1)) && !bytes.Equal(b, version(2)):
					problems = append(problems, fmt.Sprintf("a read returned %d bytes that are no complete version", len(b)))
				default:
					reads++
				}
				mu.Unlock()
			}
		}()
	}
	for v := 1; v <= versions; v++ {
		put(t, st, "atomic/key", version(v))
	}
	cancel()
	wg.Wait()
	if len(problems) > 0 {
		t.Fatalf("%d problems in %d reads, first: %s", len(problems), reads+len(problems), problems[0])
	}
	wantBytes(t, "Get after the overwrites", get(t, st, "atomic/key"), version(versions))
}
