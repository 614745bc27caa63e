package main

import (
	"io"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/pgtest"
)

// TestSafekeeperGOMAXPROCS: `strata safekeeper --gomaxprocs N` runs the
// safekeeper's Go scheduler with N processors (its /metrics say so), 0
// leaves Go's default, and a negative value is a configuration error.
func TestSafekeeperGOMAXPROCS(t *testing.T) {
	bin := buildStrata(t)
	gomaxprocs := func(n string) string {
		t.Helper()
		maddr := pgtest.FreeAddr(t)
		srv := startServer(t, bin, "", "safekeeper", "--id", "sk1", "--data-dir", t.TempDir(),
			"--listen", pgtest.FreeAddr(t), "--metrics-addr", maddr, "--gomaxprocs", n)
		defer srv.stop()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if resp, err := http.Get("http://" + maddr + "/metrics"); err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if v, ok := metricValue(string(body), "go_sched_gomaxprocs_threads"); ok {
					return v
				}
				t.Fatalf("no go_sched_gomaxprocs_threads in the safekeeper's /metrics:\n%s", body)
			}
			if srv.exited() {
				t.Fatalf("strata safekeeper exited: %s", srv.stderr.String())
			}
			if time.Now().After(deadline) {
				t.Fatalf("no /metrics on %s within 30 s: %s", maddr, srv.stderr.String())
			}
		}
	}
	if got := gomaxprocs("1"); got != "1" {
		t.Errorf("--gomaxprocs 1: the safekeeper runs with GOMAXPROCS %s", got)
	}
	if got := gomaxprocs("3"); got != "3" {
		t.Errorf("--gomaxprocs 3: the safekeeper runs with GOMAXPROCS %s", got)
	}
	// Go's default on this machine is what this test process has.
	if got, want := gomaxprocs("0"), strconv.Itoa(runtime.GOMAXPROCS(0)); got != want {
		t.Errorf("--gomaxprocs 0: the safekeeper runs with GOMAXPROCS %s, want Go's default %s", got, want)
	}
	_, e, code := run(t, bin, t.TempDir(), nil, "safekeeper", "--id", "sk1", "--data-dir", t.TempDir(), "--gomaxprocs", "-1")
	if code != exitConfig || !strings.Contains(e, "--gomaxprocs -1") {
		t.Errorf("--gomaxprocs -1: exit %d, want %d and a message naming the flag (%q)", code, exitConfig, e)
	}
}
