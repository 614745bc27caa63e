package pluginhost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// TestExampleMemoryPluginAcceptance runs the acceptance suite against the
// example plugin (examples/objectstore-memory), built with go build and run
// as a real subprocess per store, checksum and mTLS on. It streams the full
// 256 MiB object through the process boundary (32 MiB under -short) and
// fails if the host's heap grows by more than 64 MiB meanwhile.
func TestExampleMemoryPluginAcceptance(t *testing.T) {
	path, sum := buildPlugin(t, "objectstore-memory")
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		return openExternal(t, Spec{Name: "memory", Path: path, SHA256: sum, ConfigJSON: []byte(`{}`)})
	}, storetest.Options{StrictClose: true, BigHeapLimit: 64 << 20, ListCount: 1100})
}

// TestFSPluginAcceptance runs the acceptance suite against the fs plugin
// binary (plugins/objectstore/fs/cmd/strata-objectstore-fs), with a small
// big object (the full size runs against the example plugin) and without
// fsync (the fs package's own tests cover durability; this one covers the
// boundary, and fsyncs on a busy disk would dominate it).
func TestFSPluginAcceptance(t *testing.T) {
	path, sum := buildPlugin(t, "strata-objectstore-fs")
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		cfg, _ := json.Marshal(map[string]any{"root": t.TempDir(), "no_sync": true})
		return openExternal(t, Spec{Name: "fs", Path: path, SHA256: sum, ConfigJSON: cfg})
	}, storetest.Options{StrictClose: true, BigSize: 16 << 20})
}

func putBytes(t *testing.T, st objectstore.Store, key string, b []byte) {
	t.Helper()
	if err := st.Put(context.Background(), key, bytes.NewReader(b), objectstore.PutOptions{Size: int64(len(b))}); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func getBytes(t *testing.T, st objectstore.Store, key string) []byte {
	t.Helper()
	rc, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%q): reading: %v", key, err)
	}
	return b
}

// wantCrashError checks the error a caller sees when the plugin dies under it.
func wantCrashError(t *testing.T, what string, err error, name string, pid int) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: no error although the plugin was killed", what)
	}
	want := `objectstore plugin "` + name + `" (pid ` + strconv.Itoa(pid) + `) exited`
	if !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: error %q does not contain %q", what, err, want)
	}
	if !errors.Is(err, objectstore.ErrTransient) {
		t.Fatalf("%s: error %v does not match ErrTransient", what, err)
	}
}

// wantRecovered checks that the plugin runs again, as a new process, and
// serves calls.
func wantRecovered(t *testing.T, st *ObjectStore, oldPID int) {
	t.Helper()
	data := []byte("after the crash")
	putBytes(t, st, "after", data)
	if got := getBytes(t, st, "after"); !bytes.Equal(got, data) {
		t.Fatalf("after restart: got %q", got)
	}
	if st.PID() == oldPID || st.PID() == 0 {
		t.Fatalf("after restart: pid %d, old pid %d", st.PID(), oldPID)
	}
	if st.Restarts() != 1 {
		t.Fatalf("Restarts() = %d, want 1", st.Restarts())
	}
}

// TestKillDuringGet kill -9s the plugin while the host reads a large
// object from it: the reader fails with a clear error, and the next call
// succeeds on a restarted plugin.
func TestKillDuringGet(t *testing.T) {
	path, sum := buildPlugin(t, "objectstore-memory")
	st := openExternal(t, Spec{Name: "mem", Path: path, SHA256: sum})
	// Larger than gRPC's largest flow-control window (16 MiB), so that most
	// of it is still in the plugin when the plugin dies.
	const size = 40 << 20
	big := storetest.Pattern{Seed: 7}.Bytes(0, size)
	putBytes(t, st, "big", big)

	rc, err := st.Get(context.Background(), "big")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(rc, head); err != nil {
		t.Fatal(err)
	}
	pid := st.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, rc)
	if n >= size-(1<<20) {
		t.Fatalf("read the whole object (%d bytes) from a killed plugin", n)
	}
	wantCrashError(t, "reading from a killed plugin", err, "mem", pid)
	t.Logf("killed during Get: %v", err)
	wantRecovered(t, st, pid)
}

// killingReader yields n bytes and kills pid after the first after bytes.
type killingReader struct {
	n, after, done int
	pid            func() int
	killed         int
}

func (k *killingReader) Read(p []byte) (int, error) {
	if k.done >= k.n {
		return 0, io.EOF
	}
	if k.done >= k.after && k.killed == 0 {
		k.killed = k.pid()
		_ = syscall.Kill(k.killed, syscall.SIGKILL)
	}
	m := min(len(p), k.n-k.done)
	k.done += m
	return m, nil
}

// TestKillDuringPut kill -9s the plugin in the middle of a streamed Put.
func TestKillDuringPut(t *testing.T) {
	path, sum := buildPlugin(t, "objectstore-memory")
	st := openExternal(t, Spec{Name: "mem", Path: path, SHA256: sum})
	r := &killingReader{n: 256 << 20, after: 8 << 20, pid: st.PID}
	// Size -1: the memory plugin would otherwise reserve all 256 MiB up front.
	err := st.Put(context.Background(), "big", r, objectstore.PutOptions{Size: -1})
	if r.killed == 0 {
		t.Fatal("the reader never killed the plugin")
	}
	wantCrashError(t, "Put into a killed plugin", err, "mem", r.killed)
	t.Logf("killed during Put: %v", err)
	wantRecovered(t, st, r.killed)
	if _, err := st.Stat(context.Background(), "big"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("the interrupted Put is visible after restart: %v", err)
	}
}

// TestKillBetweenCalls: a plugin that dies while idle is restarted by the
// next call, which succeeds.
func TestKillBetweenCalls(t *testing.T) {
	st := openExternal(t, selfSpec(t, "memory"))
	pid := st.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !st.cur.Load().proc.exited() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	wantRecovered(t, st, pid)
}

// TestWrongChecksum: a binary whose SHA-256 differs from the config is
// refused before it runs, with an error naming the plugin and the binary.
func TestWrongChecksum(t *testing.T) {
	spec := selfSpec(t, "memory")
	spec.Name = "fs-prod"
	spec.SHA256 = strings.Repeat("ab", 32)
	_, err := OpenObjectStore(context.Background(), spec, testLog(t))
	if !errors.Is(err, ErrChecksum) {
		t.Fatalf("got %v, want ErrChecksum", err)
	}
	t.Logf("wrong checksum: %v", err)
	for _, want := range []string{`"fs-prod"`, spec.Path, spec.SHA256} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	spec.SHA256 = "not-hex"
	if _, err := OpenObjectStore(context.Background(), spec, testLog(t)); err == nil || !strings.Contains(err.Error(), "64 hex digits") {
		t.Fatalf("malformed sha256: got %v", err)
	}
	// The right checksum runs.
	sum, err := FileSHA256(spec.Path)
	if err != nil {
		t.Fatal(err)
	}
	spec.SHA256 = strings.ToUpper(sum)
	openExternal(t, spec)
}

// TestMissingBinary: a missing binary is a clear error naming the plugin
// and the path.
func TestMissingBinary(t *testing.T) {
	path := filepath.Join(t.TempDir(), "strata-objectstore-nope")
	_, err := OpenObjectStore(context.Background(), Spec{Name: "nope", Path: path}, testLog(t))
	if err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want an error matching os.ErrNotExist", err)
	}
	t.Logf("missing binary: %v", err)
	for _, want := range []string{`"nope"`, path, "cannot start"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if _, err := OpenObjectStore(context.Background(), Spec{Name: "nopath"}, testLog(t)); err == nil || !strings.Contains(err.Error(), `"nopath"`) {
		t.Fatalf("empty path: got %v", err)
	}
}

// TestNotAPlugin: an executable that is not a strata plugin fails to start
// with an error naming it.
func TestNotAPlugin(t *testing.T) {
	script := filepath.Join(t.TempDir(), "fake-plugin")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hello\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := OpenObjectStore(context.Background(), Spec{Name: "fake", Path: script}, testLog(t))
	if err == nil {
		t.Fatal("a shell script started as a plugin")
	}
	t.Logf("not a plugin: %v", err)
	for _, want := range []string{`"fake"`, script, "cannot start"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestUnsupportedVersion: a plugin built for another protocol version is
// refused with ErrVersion and a message that says what to do.
func TestUnsupportedVersion(t *testing.T) {
	spec := selfSpec(t, "v99")
	_, err := OpenObjectStore(context.Background(), spec, testLog(t))
	if !errors.Is(err, ErrVersion) {
		t.Fatalf("got %v, want ErrVersion", err)
	}
	t.Logf("unsupported version: %v", err)
	for _, want := range []string{`"test-v99"`, "version 1", "Plugin version: 99", "rebuild"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// TestConfigRefused: a plugin whose factory refuses the config fails to
// open with the plugin's own message.
func TestConfigRefused(t *testing.T) {
	_, err := OpenObjectStore(context.Background(), selfSpec(t, "badcfg"), testLog(t))
	if err == nil || !strings.Contains(err.Error(), "badcfg: root is required") || !strings.Contains(err.Error(), `"test-badcfg"`) {
		t.Fatalf("got %v", err)
	}
}

// syncBuffer is a goroutine-safe buffer for log output.
type syncBuffer struct {
	mu chan struct{}
	b  bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }
func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string {
	s.mu <- struct{}{}
	defer func() { <-s.mu }()
	return s.b.String()
}

// TestPluginLogForwarded: a plugin's zerolog lines arrive in the host's
// zerolog log with their level, message and fields, plus the plugin's name;
// lines below the host's level are dropped.
func TestPluginLogForwarded(t *testing.T) {
	buf := newSyncBuffer()
	spec := selfSpec(t, "log")
	spec.ConfigJSON = []byte(`{"root":"/data"}`)
	st, err := OpenObjectStore(context.Background(), spec, zerolog.New(buf).Level(zerolog.InfoLevel))
	if err != nil {
		t.Fatal(err)
	}
	var line, plain map[string]any
	deadline := time.Now().Add(5 * time.Second)
	for (line == nil || plain == nil) && time.Now().Before(deadline) {
		for _, l := range strings.Split(buf.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) != nil {
				continue
			}
			switch m["message"] {
			case "hello from the plugin":
				line = m
			case "a plain stderr line":
				plain = m
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if line == nil {
		t.Fatalf("the plugin's log line did not reach the host log:\n%s", buf.String())
	}
	if line["level"] != "warn" || line["plugin"] != "test-log" || line["answer"] != "forty-two" {
		t.Fatalf("forwarded line lost level or fields: %v", line)
	}
	if cfg, _ := line["config"].(map[string]any); cfg["root"] != "/data" {
		t.Fatalf("forwarded line lost the nested config field: %v", line)
	}
	if strings.Contains(buf.String(), "debug line the host must drop") {
		t.Fatalf("a plugin Debug line passed a host logger at Info:\n%s", buf.String())
	}
	if plain == nil || plain["plugin"] != "test-log" {
		t.Fatalf("a plain stderr line of the plugin did not reach the host log with the plugin's name: %v\n%s", plain, buf.String())
	}
}

// TestCloseStopsProcess: Close stops the plugin process, and later calls
// fail with ErrClosed without restarting it.
func TestCloseStopsProcess(t *testing.T) {
	st, err := OpenObjectStore(context.Background(), selfSpec(t, "memory"), testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	inst := st.cur.Load()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if !inst.proc.exited() {
		t.Fatal("plugin process still running after Close")
	}
	if _, err := st.Stat(context.Background(), "k"); !errors.Is(err, objectstore.ErrClosed) {
		t.Fatalf("Stat after Close: %v", err)
	}
	if st.PID() != 0 || st.Restarts() != 0 {
		t.Fatalf("after Close: pid %d restarts %d", st.PID(), st.Restarts())
	}
	if err := st.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestFSPluginSurvivesCrash: the fs plugin is killed during a Get; after
// the restart, what it stored before the crash is still served.
func TestFSPluginSurvivesCrash(t *testing.T) {
	path, sum := buildPlugin(t, "strata-objectstore-fs")
	cfg, _ := json.Marshal(map[string]string{"root": t.TempDir()})
	st := openExternal(t, Spec{Name: "fs", Path: path, SHA256: sum, ConfigJSON: cfg})
	const size = 40 << 20
	data := storetest.Pattern{Seed: 9}.Bytes(0, size)
	putBytes(t, st, "kept", data)
	rc, err := st.GetRange(context.Background(), "kept", 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	pid := st.PID()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, err = io.Copy(io.Discard, rc)
	wantCrashError(t, "reading from a killed fs plugin", err, "fs", pid)
	if got := getBytes(t, st, "kept"); !bytes.Equal(got, data) {
		t.Fatalf("after restart: got %d bytes, want the %d stored before the crash", len(got), len(data))
	}
	if st.Restarts() != 1 || st.PID() == pid {
		t.Fatalf("restarts %d, pid %d (old %d)", st.Restarts(), st.PID(), pid)
	}
}

// TestBackendTransientIsNotACrash: a plugin's own transient error (gRPC
// Unavailable, like a dead connection) reaches the caller as is, and the
// live plugin is not restarted.
func TestBackendTransientIsNotACrash(t *testing.T) {
	st := openExternal(t, selfSpec(t, "flaky"))
	pid := st.PID()
	_, err := st.Stat(context.Background(), "flaky")
	if !errors.Is(err, objectstore.ErrTransient) || err.Error() != "backend: 503 slow down" {
		t.Fatalf("Stat: %v, want the backend's transient error unchanged", err)
	}
	if _, err := st.Stat(context.Background(), "other"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("Stat(other): %v", err)
	}
	if st.PID() != pid || st.Restarts() != 0 {
		t.Fatalf("a backend error restarted the plugin: pid %d -> %d, restarts %d", pid, st.PID(), st.Restarts())
	}
}

func TestBackoff(t *testing.T) {
	o := Options{RestartBackoff: 100 * time.Millisecond, MaxRestartBackoff: time.Second}.withDefaults()
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := o.backoff(i + 1); got != w*time.Millisecond && !(w == 1000 && got == time.Second) {
			t.Errorf("backoff(%d) = %v, want %v", i+1, got, w*time.Millisecond)
		}
	}
}

// TestCrashLoopBacksOff: a plugin that dies at every start is restarted
// with growing pauses, and each failed call still returns promptly with a
// clear error.
func TestCrashLoopBacksOff(t *testing.T) {
	spec := selfSpec(t, "memory")
	st, err := OpenObjectStoreOptions(context.Background(), spec, Options{RestartBackoff: 50 * time.Millisecond}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	// Replace the binary's mode by one that does not exist: every restart
	// now fails (the process exits before the handshake).
	st.spec.Args = []string{modeArg + "no-such-mode"}
	_ = syscall.Kill(st.PID(), syscall.SIGKILL)
	var starts []time.Time
	for range 3 {
		_, err := st.Stat(context.Background(), "k")
		starts = append(starts, time.Now())
		if err == nil {
			t.Fatal("Stat succeeded on a plugin that cannot start")
		}
		if !strings.Contains(err.Error(), `"test-memory"`) {
			t.Fatalf("error does not name the plugin: %v", err)
		}
	}
	if gap1, gap2 := starts[1].Sub(starts[0]), starts[2].Sub(starts[1]); gap2 < 90*time.Millisecond || gap1 < 45*time.Millisecond {
		t.Fatalf("restarts not backed off: gaps %v, %v", gap1, gap2)
	}
}

// processGone reports whether pid no longer runs (absent or a zombie).
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the parenthesized command name.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}

// TestNoOrphanPlugin: when the host is killed with -9, its plugin dies too.
func TestNoOrphanPlugin(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	host := exec.Command(exe, modeArg+"host")
	out, err := host.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	host.Stderr = os.Stderr
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = host.Process.Kill(); _ = host.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the plugin pid from the host: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || pid <= 0 {
		t.Fatalf("host printed %q", line)
	}
	t.Cleanup(func() {
		if !processGone(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if processGone(pid) {
		t.Fatalf("plugin pid %d not running before the host is killed", pid)
	}
	if err := host.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = host.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin pid %d still runs 5s after its host was killed", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFSPluginConfigErrors: the fs plugin reports a missing root or an
// unknown key as its own error, and the host names the plugin.
func TestFSPluginConfigErrors(t *testing.T) {
	path, sum := buildPlugin(t, "strata-objectstore-fs")
	for _, tc := range []struct{ cfg, want string }{
		{``, "required"},
		{`null`, "required"},
		{`{"root": "/tmp/x", "rot": 1}`, `unknown field "rot"`},
	} {
		_, err := OpenObjectStore(context.Background(), Spec{Name: "fs", Path: path, SHA256: sum, ConfigJSON: []byte(tc.cfg)}, testLog(t))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), `objectstore plugin "fs"`) {
			t.Errorf("config %q: got %v, want an error naming the plugin and saying %q", tc.cfg, err, tc.want)
		}
	}
}

// TestMTLSRequired: the plugin's socket only talks to the host that started
// it: a client without the host's certificate (here: no TLS at all) gets no
// answer, while the host's own calls work.
func TestMTLSRequired(t *testing.T) {
	st := openExternal(t, selfSpec(t, "memory"))
	rc := st.cur.Load().proc.client.ReattachConfig()
	if rc == nil || rc.Addr == nil {
		t.Fatal("no plugin address")
	}
	conn, err := grpc.NewClient("passthrough:///plugin",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, rc.Addr.Network(), rc.Addr.String())
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	intruder := objectstore.NewGRPCClient(conn)
	if _, err := intruder.Stat(ctx, "k"); err == nil || errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("a client without the host's certificate reached the store: %v", err)
	} else {
		t.Logf("plaintext client refused: %v", err)
	}
	if _, err := st.Stat(context.Background(), "k"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("host Stat: %v", err)
	}
}

// TestLaunch: the contract-free launcher returns a process with the
// dispensed client, which works, and Kill stops it.
func TestLaunch(t *testing.T) {
	p, err := Launch(selfSpec(t, "memory"), objectstore.PluginKind, objectstore.PluginProtocolVersion,
		&objectstore.GRPCPlugin{}, Options{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	c, ok := p.Client().(*objectstore.GRPCClient)
	if !ok {
		t.Fatalf("Client() is %T", p.Client())
	}
	if err := c.Configure(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stat(context.Background(), "k"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("Stat: %v", err)
	}
	if p.PID() <= 0 || p.Exited() || !p.Alive() {
		t.Fatalf("pid %d exited %v alive %v", p.PID(), p.Exited(), p.Alive())
	}
	p.Kill()
	if !p.Exited() || p.Alive() || !processGone(p.PID()) {
		t.Fatalf("after Kill: exited %v alive %v", p.Exited(), p.Alive())
	}
}

// TestWrongKind: a strata plugin of another kind (here: a binary that
// serves nothing under the object store service) is refused at open with
// an error that says so.
func TestWrongKind(t *testing.T) {
	_, err := OpenObjectStore(context.Background(), selfSpec(t, "other-kind"), testLog(t))
	if err == nil || !strings.Contains(err.Error(), "not an objectstore plugin") || !strings.Contains(err.Error(), `"test-other-kind"`) {
		t.Fatalf("got %v", err)
	}
	t.Logf("wrong kind: %v", err)
}
