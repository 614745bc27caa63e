package safekeeper

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/sdk/pg"
)

// BenchmarkStreamWAL: WAL served over gRPC StreamWAL from a safekeeper's
// store to a client on loopback, in MB/s (64 MiB per iteration).
func BenchmarkStreamWAL(b *testing.B) {
	cfg := DefaultConfig()
	cfg.DataDir, cfg.ListenAddr, cfg.VerifyOnStart = b.TempDir(), "127.0.0.1:0", false
	n, err := New(cfg, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	const start, size = pg.LSN(pg.WALSegmentSize), 64 << 20
	st := n.Store()
	st.Init(start, 1, 1)
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i * 31)
	}
	for p := start; p < start+size; p += pg.LSN(len(chunk)) {
		if err := st.Write(p, chunk); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := st.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := n.Listen(); err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	c, err := server.Dial(n.Addr())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var got int
		err := c.ReadWAL(ctx, start, start+size, server.BoundFlush, func(_ pg.LSN, d []byte) error {
			got += len(d)
			return nil
		})
		if err != nil || got != size {
			b.Fatalf("read %d bytes: %v", got, err)
		}
	}
}

var (
	latRE = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
	tpsRE = regexp.MustCompile(`tps = ([0-9.]+)`)
)

// BenchmarkPgbenchCommitLatency: the commit latency and TPS pgbench sees
// (scale 10, 8 clients, 15 s; 30 s with STRATA_LONG_TESTS=1) against
// Postgres alone and against Postgres with three in-process safekeepers and
// synchronous_standby_names = 'ANY 2 (sk1, sk2, sk3)'. Run with -benchtime=1x.
func BenchmarkPgbenchCommitLatency(b *testing.B) {
	dur := "15"
	if longTests() {
		dur = "30"
	}
	run := func(b *testing.B, sks bool) {
		var srv *pgtest.Server
		if sks {
			c := startCluster(b, func(c *Config) { c.Archive.Enabled = false })
			waitSync(b, c.srv, 3)
			srv = c.srv
		} else {
			srv = testpg.Start(b, testpg.Options{})
		}
		if out, err := srv.Pgbench("-i", "-q", "-s", "10", "postgres"); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			out, err := srv.Pgbench("-c", "8", "-j", "2", "-T", dur, "postgres")
			if err != nil {
				b.Fatalf("%v\n%s", err, out)
			}
			lat, _ := strconv.ParseFloat(latRE.FindStringSubmatch(out)[1], 64)
			tps, _ := strconv.ParseFloat(tpsRE.FindStringSubmatch(out)[1], 64)
			b.ReportMetric(lat, "ms/txn")
			b.ReportMetric(tps, "tps")
		}
	}
	b.Run("safekeepers=0", func(b *testing.B) { run(b, false) })
	b.Run("safekeepers=3", func(b *testing.B) { run(b, true) })
}
