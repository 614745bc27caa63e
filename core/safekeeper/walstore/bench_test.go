package walstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// BenchmarkGroupCommitThroughput: one writer appends 8 KiB chunks while a
// flusher runs back-to-back group-commit flushes (fdatasync of data and
// checksums). Reports durable MB/s and bytes per flush.
func BenchmarkGroupCommitThroughput(b *testing.B) {
	s, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	s.Init(pg.WALSegmentSize, 1, 1)
	chunk := make([]byte, 8192)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	var flushes int
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := s.Flush(); err != nil {
				b.Error(err)
				return
			}
			flushes++
		}
	}()
	b.SetBytes(int64(len(chunk)))
	b.ResetTimer()
	start := time.Now()
	lsn := s.WriteLSN()
	for i := 0; i < b.N; i++ {
		if err := s.Write(lsn, chunk); err != nil {
			b.Fatal(err)
		}
		lsn += pg.LSN(len(chunk))
	}
	close(stop)
	<-done
	if _, err := s.Flush(); err != nil {
		b.Fatal(err)
	}
	el := time.Since(start)
	b.ReportMetric(float64(lsn-pg.WALSegmentSize)/el.Seconds()/1e6, "durable-MB/s")
	if flushes > 0 {
		b.ReportMetric(float64(lsn-pg.WALSegmentSize)/float64(flushes), "bytes/flush")
	}
}

// BenchmarkGroupCommitLatency: C committers each append a record and wait
// until it is durable, sharing one flusher (the safekeeper's receive/flush
// split). Records of 300 bytes (a small commit: most flushes rewrite a
// block the flush before wrote) and of 8 KiB (a TPC-C New-Order's WAL:
// every flush reaches new blocks of the segment). Reports commits/s and the
// mean commit latency.
func BenchmarkGroupCommitLatency(b *testing.B) {
	for _, bc := range []struct{ c, rec int }{{1, 300}, {8, 300}, {1, 8192}, {8, 8192}} {
		c := bc.c
		b.Run(fmt.Sprintf("committers=%d/record=%d", bc.c, bc.rec), func(b *testing.B) {
			s, err := Open(Options{Dir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			s.Init(pg.WALSegmentSize, 1, 1)
			rec := make([]byte, bc.rec)
			var wmu sync.Mutex
			kick := make(chan struct{}, 1)
			stop := make(chan struct{})
			fdone := make(chan struct{})
			var flushes int
			go func() {
				defer close(fdone)
				for {
					select {
					case <-stop:
						return
					case <-kick:
					}
					s.Flush()
					flushes++
				}
			}()
			var total time.Duration
			var tmu sync.Mutex
			var wg sync.WaitGroup
			per := b.N/c + 1
			b.ResetTimer()
			t0 := time.Now()
			for w := 0; w < c; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < per; i++ {
						st := time.Now()
						wmu.Lock()
						end := s.WriteLSN() + pg.LSN(len(rec))
						ch := s.FlushNotify()
						if err := s.Write(s.WriteLSN(), rec); err != nil {
							wmu.Unlock()
							b.Error(err)
							return
						}
						wmu.Unlock()
						select {
						case kick <- struct{}{}:
						default:
						}
						for s.FlushLSN() < end {
							<-ch
							ch = s.FlushNotify()
							if s.FlushLSN() < end {
								select {
								case kick <- struct{}{}:
								default:
								}
							}
						}
						tmu.Lock()
						total += time.Since(st)
						tmu.Unlock()
					}
				}()
			}
			wg.Wait()
			el := time.Since(t0)
			close(stop)
			<-fdone
			n := per * c
			b.ReportMetric(float64(n)/el.Seconds(), "commits/s")
			b.ReportMetric(float64(total.Microseconds())/float64(n)/1000, "ms/commit")
			b.ReportMetric(float64(n)/float64(max(flushes, 1)), "commits/flush")
		})
	}
}
