package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/internal/smallfs"
	"github.com/stratadb/strata/sdk/pg"
)

// startPS starts `strata pageserver` and waits until it answers.
func startPS(t *testing.T, bin, dir string, args ...string) (*testServer, *client.Client) {
	t.Helper()
	addr := pgtest.FreeAddr(t)
	srv := startServer(t, bin, dir, append([]string{"pageserver", "--no-object-store", "--metrics-addr", "", "--listen", addr}, args...)...)
	c, err := client.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := c.ListTimelines(ctx)
		cancel()
		if err == nil {
			return srv, c
		}
		if srv.exited() {
			t.Fatalf("strata pageserver exited: %s", srv.stderr.String())
		}
		if time.Now().After(deadline) {
			t.Fatalf("strata pageserver does not answer: %v\n%s", err, srv.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestPageserverCommandKill9 runs the real binary: a durable write
// survives kill -9, a pending one does not, the incarnation changes, and
// --safekeepers without --timeline is refused.
func TestPageserverCommandKill9(t *testing.T) {
	bin := buildStrata(t)
	dir := t.TempDir()
	data := filepath.Join(dir, "ps")
	if _, e, code := run(t, bin, dir, nil, "pageserver", "--no-object-store", "--data-dir", data, "--safekeepers", "127.0.0.1:1"); code == 0 || !strings.Contains(e, "need --timeline") {
		t.Fatalf("--safekeepers alone: exit %d, %q", code, e)
	}
	if _, e, code := run(t, bin, dir, nil, "pageserver", "--no-object-store", "--data-dir", data, "--safekeepers", "127.0.0.1:1", "--timeline", "nothex"); code == 0 {
		t.Fatalf("bad --timeline accepted: %q", e)
	}
	ctx := context.Background()
	tl := pg.TimelineID{0xC1}
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	ps, c := startPS(t, bin, dir, "--data-dir", data)
	if _, err := c.CreateTimeline(ctx, tl); err != nil {
		t.Fatal(err)
	}
	pageA, pageB := bytes.Repeat([]byte{0xA}, pg.BlockSize), bytes.Repeat([]byte{0xB}, pg.BlockSize)
	if _, err := c.PutPages(ctx, tl, []client.PageWrite{{Page: rel.Page(0), W: 100, Data: pageA}}); err != nil {
		t.Fatal(err)
	}
	if err := c.AdvanceCommitLSN(ctx, tl, 100); err != nil {
		t.Fatal(err)
	}
	ack, err := c.PutPagesAck(ctx, tl, []client.PageWrite{{Page: rel.Page(1), W: 200, Data: pageB}})
	if err != nil || ack.Durable >= 200 || ack.Incarnation == 0 {
		t.Fatalf("pending write: %+v %v", ack, err)
	}
	ps.stop() // SIGKILL, and the wait for it to be gone
	_, c2 := startPS(t, bin, dir, "--data-dir", data)
	d, err := c2.GetDurable(ctx, tl)
	if err != nil || d.Incarnation == ack.Incarnation || d.Durable < 100 {
		t.Fatalf("after kill -9: %+v (before %+v) %v", d, ack, err)
	}
	if got, err := c2.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(0), RequestLSN: client.LatestLSN}); err != nil || !bytes.Equal(got, pageA) {
		t.Fatalf("durable page after kill -9: %v", err)
	}
	if _, err := c2.GetPage(ctx, tl, client.PageRequest{Page: rel.Page(1), RequestLSN: client.LatestLSN}); !errors.Is(err, timeline.ErrNotFound) {
		t.Fatalf("the pending page after kill -9: %v", err)
	}
}

// TestPageserverDiskFreeMetric: `strata pageserver` exports the free space
// of its data folder's filesystem, here a real 32 MiB tmpfs.
func TestPageserverDiskFreeMetric(t *testing.T) {
	bin := buildStrata(t)
	data := smallfs.Mount(t, 32<<20)
	maddr := pgtest.FreeAddr(t)
	startPS(t, bin, t.TempDir(), "--data-dir", data, "--metrics-addr", maddr)
	resp, err := http.Get("http://" + maddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	v, found := metricValue(string(body), "strata_pageserver_disk_free_bytes")
	free, err := strconv.ParseFloat(v, 64)
	found = found && err == nil
	if !found || free <= 0 || free > 32<<20 {
		t.Fatalf("strata_pageserver_disk_free_bytes = %g (found %v); want the free part of a 32 MiB tmpfs", free, found)
	}
}
