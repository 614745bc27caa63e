package safekeeper

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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

// BenchmarkReceiverCPU: the CPU that three synchronous WAL receivers take
// per transaction, strata's safekeepers (each its own process) against
// three `pg_receivewal --synchronous`, for the same Postgres with
// synchronous_standby_names = 'ANY 2 (...)' and the same pgbench load
// (scale 10, 8 clients, 20 s; 60 s with STRATA_LONG_TESTS=1). CPU is
// utime+stime of the receiver processes from /proc over the run, so other
// load on the machine changes the TPS but not much the CPU per
// transaction. STRATA_BENCH_RATE=<tps> runs pgbench at that fixed rate
// (-R) instead of as fast as it can: both setups then carry the same WAL
// stream with the same batching, which makes their CPU per transaction
// comparable across runs. walsender-cpu-us/txn is the CPU of Postgres'
// three walsenders, which the receivers' status replies wake. The
// safekeepers run with raw system calls on the WAL path (the default) and
// then without (--raw-syscalls=false). STRATA_BENCH_SAFEKEEPER_ARGS adds
// flags to every safekeeper (e.g. "--peer-poll-interval=0"). Run with
// -benchtime=1x.
//
//	go test ./core/safekeeper -run XXX -bench ReceiverCPU -benchtime 1x
func BenchmarkReceiverCPU(b *testing.B) {
	dur := "20"
	if longTests() {
		dur = "60"
	}
	rate := os.Getenv("STRATA_BENCH_RATE")
	run := func(b *testing.B, srv *pgtest.Server, pids []int) {
		if out, err := srv.Pgbench("-i", "-q", "-s", "10", "postgres"); err != nil {
			b.Fatalf("%v\n%s", err, out)
		}
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			srv.Exec("postgres", "CHECKPOINT")
			lsn0 := testpg.FlushLSN(b, srv)
			ws := walsenders(b, srv)
			u0, w0 := procUsage(b, pids), procUsage(b, ws)
			args := []string{"-c", "8", "-j", "2", "-N", "-T", dur}
			if rate != "" {
				args = append(args, "-R", rate)
			}
			out, err := srv.Pgbench(append(args, "postgres")...)
			if err != nil {
				b.Fatalf("%v\n%s", err, out)
			}
			u, w := procUsage(b, pids).sub(u0), procUsage(b, ws).sub(w0)
			wal := float64(testpg.FlushLSN(b, srv) - lsn0)
			xm, tm := xactsRE.FindStringSubmatch(out), tpsRE.FindStringSubmatch(out)
			if xm == nil || tm == nil {
				b.Fatalf("no transaction count or TPS in pgbench's output:\n%s", out)
			}
			xacts, _ := strconv.ParseFloat(xm[1], 64)
			tps, _ := strconv.ParseFloat(tm[1], 64)
			if xacts == 0 || wal == 0 {
				b.Fatalf("no transactions or no WAL:\n%s", out)
			}
			b.ReportMetric(u.cpu.Seconds()*1e6/xacts, "recv-cpu-us/txn")
			b.ReportMetric(u.cpu.Seconds()/(wal/(1<<20)), "recv-cpu-s/MB")
			b.ReportMetric(float64(u.calls)/xacts, "recv-rw-calls/txn")
			b.ReportMetric(float64(u.switches)/xacts, "recv-switches/txn")
			b.ReportMetric(w.cpu.Seconds()*1e6/xacts, "walsender-cpu-us/txn")
			b.ReportMetric(tps, "tps")
		}
	}
	b.Run("receivers=pg_receivewal", func(b *testing.B) {
		srv := testpg.Start(b, testpg.Options{Sync: "ANY 2 (r1, r2, r3)"})
		var pids []int
		for i := 1; i <= 3; i++ {
			cmd := exec.Command(pgtest.Bin("pg_receivewal"), "-D", b.TempDir(), "--synchronous", "--no-loop",
				"-d", fmt.Sprintf("host=127.0.0.1 port=%d user=%s application_name=r%d", srv.Port, testpg.ReplUser, i))
			cmd.Env = append(os.Environ(), "PGPASSWORD="+testpg.ReplPassword)
			if err := cmd.Start(); err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			pids = append(pids, cmd.Process.Pid)
		}
		waitSync(b, srv, 3)
		run(b, srv, pids)
	})
	for _, raw := range []bool{true, false} {
		name := "receivers=safekeepers"
		if !raw {
			name += ",raw-syscalls=false"
		}
		b.Run(name, func(b *testing.B) {
			// The production defaults of the intervals, not the tests'
			// short ones; no archiving (pg_receivewal does none).
			args := []string{"--status-interval", "1s", "--control-sync-interval", "1s", "--archive=false",
				fmt.Sprintf("--raw-syscalls=%t", raw)}
			c := startProcCluster(b, append(args, strings.Fields(os.Getenv("STRATA_BENCH_SAFEKEEPER_ARGS"))...)...)
			waitSync(b, c.srv, 3)
			var pids []int
			c.mu.Lock()
			for _, cmd := range c.cmds {
				pids = append(pids, cmd.Process.Pid)
			}
			c.mu.Unlock()
			run(b, c.srv, pids)
		})
	}
}

// walsenders returns the PIDs of srv's walsenders (the Postgres side of
// the receivers' cost: a walsender wakes for every status reply).
func walsenders(b *testing.B, srv *pgtest.Server) []int {
	out := srv.QueryString("postgres", "SELECT string_agg(pid::text, ',') FROM pg_stat_replication")
	var pids []int
	for _, f := range strings.Split(out, ",") {
		pid, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			b.Fatalf("walsender PIDs %q: %v", out, err)
		}
		pids = append(pids, pid)
	}
	if len(pids) != 3 {
		b.Fatalf("walsender PIDs %v: want 3", pids)
	}
	return pids
}

var xactsRE = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)

// procUsage is what the processes have used so far: user plus system CPU
// (utime + stime of /proc/PID/stat) and read and write system calls
// (syscr + syscw of /proc/PID/io: file and socket I/O, fsync not counted).
// usage is what the receiver processes used.
type usage struct {
	cpu      time.Duration
	calls    int64 // read and write system calls (/proc/<pid>/io)
	switches int64 // context switches of every thread (/proc/<pid>/task/*/status)
}

func (u usage) sub(v usage) usage {
	return usage{u.cpu - v.cpu, u.calls - v.calls, u.switches - v.switches}
}

// procUsage sums the usage of pids from /proc.
func procUsage(t testing.TB, pids []int) usage {
	t.Helper()
	read := func(path string) string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	add := func(sum *int64, path, v string) {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		*sum += n
	}
	var ticks int64
	var u usage
	for _, pid := range pids {
		path := fmt.Sprintf("/proc/%d/stat", pid)
		st := read(path)
		// The command name (field 2) may hold spaces: count from its end.
		f := strings.Fields(st[strings.LastIndexByte(st, ')')+1:])
		for _, v := range f[11:13] { // utime, stime: fields 14 and 15
			add(&ticks, path, v)
		}
		path = fmt.Sprintf("/proc/%d/io", pid)
		for _, line := range strings.Split(read(path), "\n") {
			if k, v, ok := strings.Cut(line, ": "); ok && (k == "syscr" || k == "syscw") {
				add(&u.calls, path, v)
			}
		}
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
		if err != nil || len(tasks) == 0 {
			t.Fatalf("the threads of %d: %v", pid, err)
		}
		for _, path := range tasks {
			b, err := os.ReadFile(path)
			if err != nil {
				continue // the thread ended
			}
			for _, line := range strings.Split(string(b), "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
					add(&u.switches, path, v)
				}
			}
		}
	}
	u.cpu = time.Duration(ticks) * time.Second / 100 // USER_HZ
	return u
}
