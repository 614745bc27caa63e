package main

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stratadb/strata/internal/testbin"
)

// buildStrata returns the strata binary of this checkout, built once.
func buildStrata(t *testing.T) string {
	t.Helper()
	return testbin.Strata(t)
}

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

func run(t *testing.T, bin, dir string, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdin = bytes.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stdout.String(), stderr.String(), code
}

func TestObjectStoreCommandFS(t *testing.T) {
	bin := buildStrata(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	os.WriteFile(cfg, []byte("objectstore:\n  type: fs\n  fs:\n    root: "+filepath.Join(dir, "objs")+"\n"), 0o644)
	data := make([]byte, 5<<20)
	rand.Read(data)
	src := filepath.Join(dir, "src")
	os.WriteFile(src, data, 0o644)

	if _, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "put", "x/one", src); code != 0 {
		t.Fatalf("put: %d %s", code, e)
	}
	if _, e, code := run(t, bin, dir, []byte("hello"), "--config", cfg, "objectstore", "put", "x/two", "-"); code != 0 {
		t.Fatalf("put stdin: %d %s", code, e)
	}
	if _, e, code := run(t, bin, dir, []byte("again"), "--config", cfg, "objectstore", "put", "--if-not-exists", "x/two", "-"); code == 0 || !strings.Contains(e, "already exists") {
		t.Fatalf("conditional put: %d %q", code, e)
	}
	out, _, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "ls", "x/")
	if code != 0 || !strings.Contains(out, "x/one") || !strings.Contains(out, "x/two") {
		t.Fatalf("ls: %d %q", code, out)
	}
	dst := filepath.Join(dir, "dst")
	if _, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "get", "x/one", dst); code != 0 {
		t.Fatalf("get: %d %s", code, e)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, data) {
		t.Fatal("get returned different bytes")
	}
	if out, _, _ := run(t, bin, dir, nil, "--config", cfg, "objectstore", "get", "x/two"); out != "hello" {
		t.Fatalf("get to stdout: %q", out)
	}
	if _, _, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "rm", "x/two", "x/never"); code != 0 {
		t.Fatalf("rm: %d", code)
	}
	if _, e, code := run(t, bin, dir, nil, "--config", cfg, "objectstore", "stat", "x/two"); code != 1 || !strings.Contains(e, "not found") {
		t.Fatalf("stat after rm: %d %q", code, e)
	}
}

func TestBadConfigIsOneClearLine(t *testing.T) {
	bin := buildStrata(t)
	dir := t.TempDir()
	for name, text := range map[string]string{
		"typo.yaml":     "objectstore:\n  fs:\n    rot: x\n",
		"nobucket.yaml": "objectstore:\n  type: s3\n",
		"type.yaml":     "log:\n  level: [a]\n",
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(text), 0o644)
		_, e, code := run(t, bin, dir, nil, "--config", p, "objectstore", "ls")
		if code != exitConfig {
			t.Errorf("%s: exit %d, want %d (%q)", name, code, exitConfig, e)
		}
		lines := strings.Split(strings.TrimSpace(e), "\n")
		if len(lines) != 1 || !strings.Contains(e, name) {
			t.Errorf("%s: want one line naming the file, got %q", name, e)
		}
	}
	missing := filepath.Join(dir, "missing.yaml")
	if _, e, code := run(t, bin, dir, nil, "--config", missing, "objectstore", "ls"); code != exitConfig || !strings.Contains(e, "missing.yaml") {
		t.Errorf("a missing config file: exit %d, want %d (%q)", code, exitConfig, e)
	}
}

// TestUnknownSubcommand: a mistyped command under a group fails with its
// name and a suggestion, as one under the root does; a group alone still
// prints its help.
func TestUnknownSubcommand(t *testing.T) {
	bin := buildStrata(t)
	dir := t.TempDir()
	for _, c := range []struct{ args, want string }{
		{"timeline list", `unknown command "list" for "strata timeline"; did you mean ls?`},
		{"wal dmp", `unknown command "dmp" for "strata wal"; did you mean dump?`},
		{"bench rnu", `unknown command "rnu" for "strata bench"; did you mean run?`},
		{"objectstore frobnicate", `unknown command "frobnicate" for "strata objectstore" (run 'strata objectstore --help'`},
		{"statuss", `unknown command "statuss" for "strata"`},
	} {
		out, e, code := run(t, bin, dir, nil, strings.Fields(c.args)...)
		if code != 1 || !strings.Contains(e, c.want) || out != "" {
			t.Errorf("strata %s: exit %d, stderr %q, stdout %q; want exit 1 and %q", c.args, code, e, out, c.want)
		}
	}
	for _, group := range []string{"timeline", "wal", "objectstore", "bench"} {
		out, e, code := run(t, bin, dir, nil, group)
		if code != 0 || !strings.Contains(out, "Available Commands:") || strings.Contains(out, "[flags]\n  strata "+group+" [command]") {
			t.Errorf("strata %s: exit %d, stderr %q, stdout %q; want its help", group, code, e, out)
		}
	}
}

// TestStatusOfStoppedCluster: `strata status` on a cluster that is not
// running says so (exit 1) and still shows the disk its state takes.
func TestStatusOfStoppedCluster(t *testing.T) {
	bin := buildStrata(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	state, objs := filepath.Join(dir, "state"), filepath.Join(dir, "objs")
	os.WriteFile(cfg, []byte("cluster:\n  data_dir: "+state+"\nobjectstore:\n  type: fs\n  fs:\n    root: "+objs+"\n"), 0o644)
	if out, e, code := run(t, bin, dir, nil, "--config", cfg, "status"); code != 1 || out != "" || !strings.Contains(e, "not running") || !strings.Contains(e, state) {
		t.Fatalf("status of a cluster never started: exit %d, stdout %q, stderr %q; want 1, nothing, not running, the folder it looked in", code, out, e)
	}
	// down says where it looked, too: a relative data_dir names a folder
	// under the working directory.
	if out, e, code := run(t, bin, dir, nil, "--config", cfg, "down"); code != 0 || !strings.Contains(out+e, "not running") || !strings.Contains(out+e, state) {
		t.Fatalf("down of a cluster never started: exit %d, output %q; want 0, not running, the folder it looked in", code, out+e)
	}
	os.MkdirAll(filepath.Join(state, "pageserver", "timelines"), 0o755)
	os.WriteFile(filepath.Join(state, "pageserver", "timelines", "layer"), make([]byte, 3<<20), 0o644)
	os.MkdirAll(objs, 0o755)
	os.WriteFile(filepath.Join(objs, "obj"), make([]byte, 1<<20), 0o644)
	out, e, code := run(t, bin, dir, nil, "--config", cfg, "status")
	if code != 1 || !strings.Contains(e, "not running") {
		t.Fatalf("status of a stopped cluster: exit %d, stderr %q; want 1, not running", code, e)
	}
	for _, want := range []string{"pageserver 3.0 MiB", "objects 1.0 MiB", "safekeepers 0 B", "free ", "on the filesystem of " + state} {
		if !strings.Contains(out, want) {
			t.Errorf("status of a stopped cluster does not show %q:\n%s", want, out)
		}
	}
	// A cluster whose processes were killed (its state still says it
	// runs): status shows the table and names the dead ones.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	pid := strconv.Itoa(gone.Process.Pid)
	os.WriteFile(filepath.Join(state, "cluster.json"), []byte(`{"data_dir":"`+state+`","procs":[{"name":"safekeeper sk1","pid":`+pid+`},{"name":"pageserver","pid":`+pid+`}]}`), 0o644)
	out, e, code = run(t, bin, dir, nil, "--config", cfg, "status")
	if want := "not running: safekeeper sk1 (pid " + pid + "), pageserver (pid " + pid + ")"; code != 1 || !strings.Contains(e, want) || !strings.Contains(out, "PROCESS") {
		t.Fatalf("status of a killed cluster: exit %d, stdout %q, stderr %q; want 1, the process table, %q", code, out, e, want)
	}
}

// TestComputeWaitsFindsTheClusterAgent: without --addr, `strata compute
// waits` asks the agent of the config's `strata up` cluster (the metrics
// port plus safekeepers plus one); with metrics off it says why there is no
// report.
func TestComputeWaitsFindsTheClusterAgent(t *testing.T) {
	bin := buildStrata(t)
	dir := t.TempDir()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/waits" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"state":"running","term":7,"strategy":"lfc","waits":[{"name":"getpage","count":42,"total_ns":4200000}]}`))
	}))
	defer srv.Close()
	_, portStr, _ := net.SplitHostPort(srv.Listener.Addr().String())
	port, _ := strconv.Atoi(portStr)
	cfg := filepath.Join(dir, "c.yaml")
	write := func(metricsPort int) {
		os.WriteFile(cfg, []byte(fmt.Sprintf("cluster:\n  data_dir: %s\n  metrics_port: %d\nobjectstore:\n  type: fs\n  fs:\n    root: %s\n",
			filepath.Join(dir, "state"), metricsPort, filepath.Join(dir, "objs"))), 0o644)
	}
	write(port - 4) // three safekeepers, the pageserver, then the agent
	out, e, code := run(t, bin, dir, nil, "--config", cfg, "compute", "waits")
	if code != 0 || !strings.Contains(out, "term 7") || !strings.Contains(out, "getpage") {
		t.Fatalf("compute waits: exit %d, stdout %q, stderr %q", code, out, e)
	}
	write(0)
	if _, e, code := run(t, bin, dir, nil, "--config", cfg, "compute", "waits"); code == 0 || !strings.Contains(e, "metrics_port is 0") {
		t.Fatalf("compute waits with metrics off: exit %d, stderr %q", code, e)
	}
}

// TestRestoreCommand: `strata restore` refuses a bad target, a missing
// flag, a stopped cluster (saying to start it or use --from-store), and a
// store with nothing to restore, each with exit 1 and nothing on stdout.
func TestRestoreCommand(t *testing.T) {
	bin := buildStrata(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	state, objs := filepath.Join(dir, "state"), filepath.Join(dir, "objs")
	os.WriteFile(cfg, []byte("cluster:\n  data_dir: "+state+"\nobjectstore:\n  type: fs\n  fs:\n    root: "+objs+"\n"), 0o644)
	to := filepath.Join(dir, "copy")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"restore", "--at", "yesterday", "--to", to}, `target "yesterday" is neither an LSN`},
		{[]string{"restore", "--to", to}, `required flag(s) "at" not set`},
		{[]string{"restore", "--at", "0/1000000"}, `required flag(s) "to" not set`},
		{[]string{"restore", "--at", "latest", "--to", to}, "restore from the object store alone with --from-store"},
		{[]string{"restore", "--from-store", "--at", "latest", "--to", to}, "the object store holds no timeline"},
	} {
		out, e, code := run(t, bin, dir, nil, append([]string{"--config", cfg}, c.args...)...)
		if code != 1 || out != "" || !strings.Contains(e, c.want) {
			t.Errorf("strata %s: exit %d, stdout %q, stderr %q; want exit 1 saying %q", strings.Join(c.args, " "), code, out, e, c.want)
		}
	}
	if _, err := os.Stat(to); !os.IsNotExist(err) {
		t.Errorf("a refused restore left %s: %v", to, err)
	}
}
