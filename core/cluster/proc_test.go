package cluster

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
)

func TestStartAliveStop(t *testing.T) {
	p, err := startDetached("sleeper", "/bin/sleep", []string{"30"}, filepath.Join(t.TempDir(), "log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Alive() {
		t.Fatal("not alive after start")
	}
	other := p
	other.StartTime++
	if other.Alive() {
		t.Fatal("a different start time must not count as alive (PID reuse guard)")
	}
	if err := p.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if p.Alive() {
		t.Fatal("alive after stop")
	}
	if err := p.Stop(time.Second); err != nil {
		t.Fatalf("second stop: %v", err)
	}
}

func TestStopEscalatesToKill(t *testing.T) {
	// A shell that ignores SIGTERM.
	p, err := startDetached("stubborn", "/bin/sh", []string{"-c", "trap '' TERM; sleep 30"}, filepath.Join(t.TempDir(), "log"), nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := p.Stop(300 * time.Millisecond); err == nil {
		t.Fatal("want an error saying it was killed")
	}
	if p.Alive() {
		t.Fatal("still alive after kill")
	}
}

func TestClusterServer(t *testing.T) {
	dir := "/srv/strata/.strata"
	for _, c := range []struct {
		argv []string
		name string
		ok   bool
	}{
		{[]string{"strata", "safekeeper", "--id", "sk2", "--data-dir", dir + "/safekeepers/sk2", "--listen", "127.0.0.1:1"}, "safekeeper sk2", true},
		{[]string{"/usr/bin/strata", "--config", "/etc/strata.yaml", "pageserver", "--listen", "x", "--data-dir", dir + "/pageserver"}, "pageserver", true},
		{[]string{"strata", "compute", "--mountpoint=" + dir + "/compute/pgdata"}, "compute", true},
		{[]string{"strata", "compute", "--mountpoint", dir}, "compute", true},
		// Another cluster's folder whose name starts like this one's.
		{[]string{"strata", "safekeeper", "--id", "sk1", "--data-dir", dir + "2/safekeepers/sk1"}, "", false},
		// Not a server of a cluster: a subcommand that is no server, or a
		// server elsewhere.
		{[]string{"strata", "status", "--data-dir", dir}, "", false},
		{[]string{"strata", "pageserver", "--data-dir", "/var/lib/pageserver"}, "", false},
		{[]string{"strata"}, "", false},
		{[]string{"postgres", "-D", dir + "/compute/pgdata"}, "", false},
	} {
		name, ok := clusterServer(c.argv, dir)
		if name != c.name || ok != c.ok {
			t.Errorf("clusterServer(%q) = %q, %v; want %q, %v", c.argv, name, ok, c.name, c.ok)
		}
	}
}

// TestStrayProcs runs stand-ins for a cluster's servers (the test binary
// sleeping, with the command lines strata up gives them) and finds them
// without a state file: those of this folder that lead their session, in
// start order, and Down stops them.
func TestStrayProcs(t *testing.T) {
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := []string{sleeperEnv + "=1"}
	start := func(args ...string) Proc {
		p, err := startDetached(args[0], self, args, filepath.Join(dir, "log"), env)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(time.Second) })
		return p
	}
	cl := filepath.Join(dir, "cluster")
	compute := start("compute", "--mountpoint", cl+"/compute/pgdata", "--scratch", cl+"/compute/scratch")
	ps := start("--config", dir+"/strata.yaml", "pageserver", "--data-dir", cl+"/pageserver")
	sk2 := start("safekeeper", "--id", "sk2", "--data-dir", cl+"/safekeepers/sk2")
	sk1 := start("safekeeper", "--id", "sk1", "--data-dir", cl+"/safekeepers/sk1")
	other := start("safekeeper", "--id", "sk1", "--data-dir", cl+"-other/safekeepers/sk1")
	// A supervised child: in its supervisor's session, not a leader.
	child := exec.Command(self, "safekeeper", "--id", "sk3", "--data-dir", cl+"/safekeepers/sk3")
	child.Env = append(os.Environ(), env...)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { child.Process.Kill(); child.Wait() })

	var got []Proc
	for deadline := time.Now().Add(10 * time.Second); len(got) < 4 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if got, err = strayProcs(cl); err != nil {
			t.Fatal(err)
		}
	}
	var names []string
	for _, p := range got {
		names = append(names, p.Name+"="+strconv.Itoa(p.PID))
	}
	want := []string{"safekeeper sk1=" + strconv.Itoa(sk1.PID), "safekeeper sk2=" + strconv.Itoa(sk2.PID),
		"pageserver=" + strconv.Itoa(ps.PID), "compute=" + strconv.Itoa(compute.PID)}
	if !slices.Equal(names, want) {
		t.Fatalf("strays %v, want %v", names, want)
	}

	cfg := config.Default()
	cfg.Cluster.DataDir = cl
	cfg.Cluster.SafekeeperPort = freePorts(t, 1)[0] // nothing answers there
	c, err := New(&cfg, self, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Up(context.Background(), func(string) {}); err == nil || !strings.Contains(err.Error(), "strata down") || !strings.Contains(err.Error(), "pageserver pid "+strconv.Itoa(ps.PID)) {
		t.Fatalf("up with stray processes: %v, want a refusal naming them", err)
	}
	if _, err := c.Status(context.Background()); err == nil || errors.Is(err, ErrNotRunning) || !strings.Contains(err.Error(), "4 processes") {
		t.Fatalf("status with stray processes: %v, want them named, not \"not running\"", err)
	}
	var lines []string
	if err := c.Down(context.Background(), func(s string) { lines = append(lines, s) }); err != nil {
		t.Fatal(err)
	}
	if len(lines) == 0 || !strings.Contains(lines[0], "4 processes") {
		t.Errorf("down said %q, want the processes it found", lines)
	}
	for _, p := range []Proc{compute, ps, sk1, sk2} {
		if p.Alive() {
			t.Errorf("%s (pid %d) still runs after down", p.Name, p.PID)
		}
	}
	if !other.Alive() {
		t.Error("down stopped another cluster's process")
	}
	if got, err := strayProcs(cl); err != nil || len(got) != 0 {
		t.Errorf("after down: %v, %v", got, err)
	}
}

// TestSafekeepersStopTogether checks the order of a stop: the pageserver
// first, then every safekeeper at once. Each stand-in safekeeper waits,
// after its SIGTERM, for the other two to get theirs; stopped one by one,
// each would wait in vain and leave an "alone" mark.
func TestSafekeepersStopTogether(t *testing.T) {
	dir := t.TempDir()
	sk := func(n int) string {
		return `trap '
[ -e ` + dir + `/pageserver ] || touch ` + dir + `/early.` + strconv.Itoa(n) + `
touch ` + dir + `/term.` + strconv.Itoa(n) + `
i=0
while [ $i -lt 50 ]; do
	[ -e ` + dir + `/term.1 ] && [ -e ` + dir + `/term.2 ] && [ -e ` + dir + `/term.3 ] && exit 0
	sleep 0.1; i=$((i+1))
done
touch ` + dir + `/alone.` + strconv.Itoa(n) + `
exit 0' TERM
while :; do sleep 0.1; done`
	}
	var st State
	for n := 1; n <= 3; n++ {
		p, err := startDetached("safekeeper sk"+strconv.Itoa(n), "/bin/sh", []string{"-c", sk(n)}, filepath.Join(dir, "log"+strconv.Itoa(n)), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(time.Second) })
		st.Procs = append(st.Procs, p)
	}
	ps, err := startDetached("pageserver", "/bin/sh", []string{"-c", "trap 'touch " + dir + "/pageserver; exit 0' TERM; while :; do sleep 0.1; done"}, filepath.Join(dir, "log.ps"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Stop(time.Second) })
	st.Procs = append(st.Procs, ps)
	time.Sleep(200 * time.Millisecond) // the traps are set

	if err := (&Cluster{}).stopProcs(context.Background(), &st); err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Procs {
		if p.Alive() {
			t.Errorf("%s still runs", p.Name)
		}
	}
	for n := 1; n <= 3; n++ {
		for _, mark := range []string{"term", "early", "alone"} {
			_, err := os.Stat(filepath.Join(dir, mark+"."+strconv.Itoa(n)))
			if got, want := err == nil, mark == "term"; got != want {
				t.Errorf("safekeeper sk%d: mark %q present %v, want %v", n, mark, got, want)
			}
		}
	}
}
