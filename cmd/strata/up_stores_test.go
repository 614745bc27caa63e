package main

import (
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/netfault"
	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/internal/testbin"
	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
	"github.com/stratadb/strata/plugins/objectstore/gcs/gcstest"
	"github.com/stratadb/strata/plugins/objectstore/s3/s3test"
)

// TestUpOnEveryStore runs a whole cluster on each cloud store's real
// emulator, the way an operator would: the objectstore section in the
// YAML file, credentials in the environment, `strata up`, SQL, `strata
// down`. Then the cluster's data folder is deleted, and `strata restore
// --from-store` must give the database back from the store alone: the
// layers, manifests and archived WAL went to the cloud store, not to a
// folder. Before that, `strata up` on a bucket (container) that does not
// exist must fail before it starts anything, naming the bucket and the
// key that creates it. S3 runs twice: builtin, and as an external plugin
// process (objectstore.mode: external) that every server launches.
func TestUpOnEveryStore(t *testing.T) {
	if _, err := os.Stat(pgBin("postgres")); err != nil {
		t.Skip("PostgreSQL 15 not installed")
	}
	bin := buildStrata(t)
	for _, tc := range []struct {
		name string
		// setup starts the emulator and returns the objectstore section
		// for a bucket; create adds the key that creates it.
		setup   func(t *testing.T) func(bucket string, create bool) string
		missing string // what a missing bucket's error says
	}{
		{"s3", func(t *testing.T) func(string, bool) string {
			gw := s3test.StartVersityGW(t)
			gw.SetEnv(t)
			return func(bucket string, create bool) string {
				return "  type: s3\n  s3:\n    bucket: " + bucket + "\n    prefix: c1\n    endpoint: " + gw.Endpoint +
					"\n    region: " + gw.Region + "\n    path_style: true\n    create_bucket: " + strconv.FormatBool(create) + "\n"
			}
		}, `bucket "absent" does not exist`},
		{"s3-external", func(t *testing.T) func(string, bool) string {
			// The same store as its own process: every server of the
			// cluster (and up, and restore) launches the plugin.
			gw := s3test.StartVersityGW(t)
			gw.SetEnv(t)
			plugin := testbin.ObjectStorePlugin(t, "s3")
			return func(bucket string, create bool) string {
				return "  type: s3\n  mode: external\n  plugin:\n    path: " + plugin + "\n    sha256: " + sha256File(t, plugin) +
					"\n  s3:\n    bucket: " + bucket + "\n    prefix: c1\n    endpoint: " + gw.Endpoint +
					"\n    region: " + gw.Region + "\n    path_style: true\n    create_bucket: " + strconv.FormatBool(create) + "\n"
			}
		}, `bucket "absent" does not exist`},
		{"gcs", func(t *testing.T) func(string, bool) string {
			f := gcstest.StartFakeGCS(t)
			f.SetEnv(t)
			return func(bucket string, create bool) string {
				return "  type: gcs\n  gcs:\n    bucket: " + bucket + "\n    prefix: c1\n    project_id: strata-test\n    create_bucket: " + strconv.FormatBool(create) + "\n"
			}
		}, `bucket "absent" does not exist`},
		{"azure", func(t *testing.T) func(string, bool) string {
			az := azuretest.StartAzurite(t)
			t.Setenv("STRATA_OBJECTSTORE_AZURE_CONNECTION_STRING", az.ConnectionString)
			return func(bucket string, create bool) string {
				return "  type: azure\n  azure:\n    container: " + bucket + "\n    prefix: c1\n    create_container: " + strconv.FormatBool(create) + "\n"
			}
		}, `container "absent" does not exist`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			section := tc.setup(t)
			dir := clusterDir(t)
			cfg := filepath.Join(dir, "strata.yaml")
			writeCfg := func(store string) {
				y := "cluster:\n  data_dir: " + filepath.Join(dir, "state") +
					"\n  safekeeper_port: " + strconv.Itoa(pgtest.FreePorts(t, 4)) +
					"\n  metrics_port: 0\ncompute:\n  port: " + strconv.Itoa(pgtest.FreePort(t)) +
					"\n  memory_budget: 256MB\nobjectstore:\n" + store
				if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			t.Cleanup(func() {
				if _, e, code := run(t, bin, dir, nil, "--config", cfg, "down"); code != 0 {
					t.Errorf("strata down at cleanup: exit %d: %s", code, e)
				}
			})

			// A bucket that does not exist: refused before anything starts.
			writeCfg(section("absent", false))
			_, e, code := run(t, bin, dir, nil, "--config", cfg, "up")
			if code == 0 || !strings.Contains(e, tc.missing) || !strings.Contains(e, "create_") || strings.Contains(e, "safekeeper sk1 on") {
				t.Fatalf("strata up on a missing bucket: exit %d, stderr:\n%s\nwant a failure before any process starts, saying %q and the create_ key", code, e, tc.missing)
			}
			if _, e, code := run(t, bin, dir, nil, "--config", cfg, "status"); code != 1 || !strings.Contains(e, "not running") {
				t.Fatalf("status after the refused up: exit %d, %s", code, e)
			}

			writeCfg(section("strata-data", true))
			out, e, code := run(t, bin, dir, nil, "--config", cfg, "up")
			if code != 0 {
				t.Fatalf("strata up: exit %d\n%s", code, e)
			}
			url := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
			psql(t, url, `CREATE TABLE t (a int PRIMARY KEY, b text);
				INSERT INTO t SELECT g, md5(g::text) FROM generate_series(1, 20000) g;
				CHECKPOINT;
				INSERT INTO t SELECT g, 'after the checkpoint' FROM generate_series(20001, 25000) g;`)
			want := psql(t, url, "SELECT count(*), sum(a), md5(string_agg(b, ',' ORDER BY a)) FROM t")
			if !strings.HasPrefix(want, "25000|312512500|") {
				t.Fatalf("the table reads %q", want)
			}
			if _, e, code := run(t, bin, dir, nil, "--config", cfg, "down"); code != 0 {
				t.Fatalf("strata down: exit %d\n%s", code, e)
			}

			// The machine's folder is lost; the store has the database.
			if err := os.RemoveAll(filepath.Join(dir, "state")); err != nil {
				t.Fatal(err)
			}
			to := filepath.Join(dir, "copy")
			out, e, code = run(t, bin, dir, nil, "--config", cfg, "restore", "--from-store", "--at", "latest", "--to", to)
			if code != 0 {
				t.Fatalf("strata restore --from-store: exit %d\n%s\n%s", code, out, e)
			}
			m := regexp.MustCompile(`127\.0\.0\.1:(\d+)/`).FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no port in the restore's output:\n%s", out)
			}
			pgCtl(t, to, "start", "-w", "-l", filepath.Join(to, "postgres.log"))
			t.Cleanup(func() { pgCtl(t, to, "stop", "-m", "immediate", "-w") })
			got := asPostgres(t, "psql", "-X", "-Atq", "-h", to, "-p", m[1], "-d", "postgres",
				"-c", "SELECT count(*), sum(a), md5(string_agg(b, ',' ORDER BY a)) FROM t")
			if got != want {
				t.Fatalf("the copy restored from %s alone reads %q, the cluster read %q", tc.name, got, want)
			}
		})
	}
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func pgBin(name string) string { return filepath.Join("/usr/lib/postgresql/15/bin", name) }

// clusterDir makes a folder the postgres OS user can reach (a cluster's
// data folder is below it) and removes it when the test ends, after the
// cleanups registered later (the cluster's down) ran.
func clusterDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "strata-cmd-up-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// psql runs sql on url and returns its unaligned output.
func psql(t *testing.T, url, sql string) string {
	t.Helper()
	out, err := exec.Command(pgBin("psql"), "-X", "-Atq", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql).CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// asPostgres runs a PostgreSQL program as the postgres OS user (a stock
// data folder's owner) and returns its output.
func asPostgres(t *testing.T, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(pgBin(name), args...)
	cred, err := pgtest.Credential()
	if err != nil {
		t.Fatal(err)
	}
	if cred != nil {
		cmd = exec.Command("runuser", append([]string{"-u", "postgres", "--", pgBin(name)}, args...)...)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func pgCtl(t *testing.T, dataDir string, args ...string) {
	t.Helper()
	asPostgres(t, "pg_ctl", append([]string{"-D", dataDir}, args...)...)
}

// clusterBehindHole writes the configuration of a cluster on S3 (a
// versitygw) whose path to the store goes through a netfault hole, with a
// 2 s stall timeout, and returns the strata binary, the cluster's folder,
// the configuration file and the hole. The cluster is stopped at the end.
func clusterBehindHole(t *testing.T) (bin, dir, cfg string, hole *netfault.Blackhole) {
	t.Helper()
	bin = buildStrata(t)
	gw := s3test.StartVersityGW(t)
	gw.SetEnv(t)
	u, err := url.Parse(gw.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	hole = netfault.Start(t, u.Host)
	dir = clusterDir(t)
	cfg = filepath.Join(dir, "strata.yaml")
	y := "cluster:\n  data_dir: " + filepath.Join(dir, "state") +
		"\n  safekeeper_port: " + strconv.Itoa(pgtest.FreePorts(t, 4)) +
		"\n  metrics_port: 0\ncompute:\n  port: " + strconv.Itoa(pgtest.FreePort(t)) +
		"\n  memory_budget: 256MB\nobjectstore:\n  type: s3\n  stall_timeout: 2s\n  s3:\n    bucket: strata-data\n    endpoint: http://" + hole.Addr() +
		"\n    region: " + gw.Region + "\n    path_style: true\n    create_bucket: true\n"
	if err := os.WriteFile(cfg, []byte(y), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { run(t, bin, dir, nil, "--config", cfg, "down") })
	return bin, dir, cfg, hole
}

// TestStoreStopsAnswering: a cluster on S3 whose path to the store is cut
// (connections left open, nothing answered, as when a network drops the
// packets) goes on committing; within the stall timeout and the retries
// `strata status` says that the safekeepers' archiving fails and why;
// once the path is back the lines go, and the rows are all there.
func TestStoreStopsAnswering(t *testing.T) {
	if _, err := os.Stat(pgBin("postgres")); err != nil {
		t.Skip("PostgreSQL 15 not installed")
	}
	bin, dir, cfg, hole := clusterBehindHole(t)
	out, e, code := run(t, bin, dir, nil, "--config", cfg, "up")
	if code != 0 {
		t.Fatalf("strata up: exit %d\n%s", code, e)
	}
	pgURL := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	psql(t, pgURL, "CREATE TABLE t (a int)")

	hole.Freeze()
	// Commits need the safekeepers only; a full segment is due for the
	// archive.
	psql(t, pgURL, "INSERT INTO t SELECT generate_series(1, 1000); SELECT pg_switch_wal(); INSERT INTO t VALUES (1001)")
	status := func() string {
		out, e, _ := run(t, bin, dir, nil, "--config", cfg, "status")
		return out + e
	}
	var st string
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(time.Second) {
		psql(t, pgURL, "INSERT INTO t VALUES (0)")
		if st = status(); strings.Contains(st, "archiving to the object store failing since") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("90 s after the path to the store was cut, status says nothing of it:\n%s", st)
		}
	}
	if !strings.Contains(st, "the object store stopped answering (no answer or progress for 2s)") {
		t.Fatalf("the failing line does not say why:\n%s", st)
	}
	if !strings.Contains(st, "archive   the WAL in the object store: unknown (the object store did not answer within 3 s)") {
		t.Fatalf("status does not say that the WAL in the store is unknown:\n%s", st)
	}
	t.Logf("with the path cut:\n%s", st)

	hole.Thaw()
	for deadline := time.Now().Add(120 * time.Second); ; time.Sleep(time.Second) {
		if st = status(); !strings.Contains(st, "failing since") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 minutes after the path came back, status still says:\n%s", st)
		}
	}
	if !strings.Contains(st, "archive   WAL in the object store to ") {
		t.Fatalf("with the path back, status does not say how far the WAL in the store reaches:\n%s", st)
	}
	if got := psql(t, pgURL, "SELECT count(*) FROM t WHERE a > 0"); got != "1001" {
		t.Fatalf("%s rows, want 1001", got)
	}
}

// TestUpWhileStoreDown: a cluster that has run before starts again while
// its object store does not answer (the path to it cut): `strata up` says
// so and goes on, the pageserver serves the timeline from its own disk,
// the rows are there and new commits go in; `strata status` shows the
// uploads failing; it stops with the store still out; once the path is
// back it starts without a word of the store, every row is there and
// the archive catches up.
func TestUpWhileStoreDown(t *testing.T) {
	if _, err := os.Stat(pgBin("postgres")); err != nil {
		t.Skip("PostgreSQL 15 not installed")
	}
	bin, dir, cfg, hole := clusterBehindHole(t)
	up := func() (url, progress string) {
		t.Helper()
		start := time.Now()
		out, e, code := run(t, bin, dir, nil, "--config", cfg, "up")
		if code != 0 {
			t.Fatalf("strata up: exit %d\n%s", code, e)
		}
		t.Logf("strata up took %s", time.Since(start).Round(time.Second))
		return strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:]), e
	}
	down := func() {
		t.Helper()
		if _, e, code := run(t, bin, dir, nil, "--config", cfg, "down"); code != 0 {
			t.Fatalf("strata down: exit %d\n%s", code, e)
		}
	}
	pgURL, _ := up()
	psql(t, pgURL, "CREATE TABLE t (a int); INSERT INTO t SELECT generate_series(1, 1000)")
	down()
	// create_bucket asks the store at every open (as it is meant for test
	// servers); a real bucket exists, and opening the store asks nothing.
	y, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, []byte(strings.Replace(string(y), "create_bucket: true", "create_bucket: false", 1)), 0o644); err != nil {
		t.Fatal(err)
	}

	hole.Freeze()
	pgURL, progress := up()
	if !strings.Contains(progress, "object store does not answer") || !strings.Contains(progress, "starting on this machine's data") {
		t.Fatalf("strata up with the store down does not say so:\n%s", progress)
	}
	if got := psql(t, pgURL, "SELECT count(*) FROM t"); got != "1000" {
		t.Fatalf("%s rows with the store down, want 1000", got)
	}
	// New pages for the pageserver to upload: a checkpoint writes them.
	psql(t, pgURL, "INSERT INTO t SELECT generate_series(1001, 2000); CHECKPOINT")
	status := func() string {
		out, e, _ := run(t, bin, dir, nil, "--config", cfg, "status")
		return out + e
	}
	st := status()
	t.Logf("status with the store down:\n%s", st)
	if !strings.Contains(st, "the object store did not answer within 3 s") {
		t.Fatalf("status with the store down does not say that it does not answer:\n%s", st)
	}
	// A stop with the store still out: the pageserver's last publish and
	// the safekeepers' last archive step give up within their bounds.
	start := time.Now()
	down()
	t.Logf("strata down with the store down took %s", time.Since(start).Round(time.Second))
	// The pageserver asks the store once (3 s) and does not wait out its
	// 20 s publish (down took 30-31 s before it and the safekeepers asked).
	b, err := os.ReadFile(filepath.Join(dir, "state", "pageserver", "pageserver.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "timelines not published to the object store at shutdown: the store does not answer") {
		t.Fatalf("the pageserver's log has no skipped shutdown publish:\n%s", b[max(0, len(b)-3000):])
	}
	// So do the safekeepers before their last archive step (10 s).
	for _, id := range []string{"sk1", "sk2", "sk3"} {
		b, err := os.ReadFile(filepath.Join(dir, "state", "safekeepers", id, "safekeeper.log"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "not archived at stop: the object store does not answer") {
			t.Fatalf("safekeeper %s's log has no skipped last archive step:\n%s", id, b[max(0, len(b)-3000):])
		}
	}

	hole.Thaw()
	pgURL, progress = up()
	if strings.Contains(progress, "does not answer") {
		t.Fatalf("strata up with the store back still says it does not answer:\n%s", progress)
	}
	if got := psql(t, pgURL, "SELECT count(*) FROM t"); got != "2000" {
		t.Fatalf("%s rows after the store came back, want 2000", got)
	}
	for deadline := time.Now().Add(150 * time.Second); ; time.Sleep(time.Second) {
		if st = status(); !strings.Contains(st, "failing since") && strings.Contains(st, "archive   WAL in the object store to ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("150 s after the path came back, status says:\n%s", st)
		}
	}
}
