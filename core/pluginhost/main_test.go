package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/stratadb/strata/internal/testbin"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/plugin"
)

// The test binary doubles as a plugin: run with the single argument
// "pluginhost-test-mode=MODE" (as Spec.Args), it serves instead of testing.
// Modes:
//
//	memory  an object store plugin over objectstore.Memory
//	v99     the same, but speaking protocol version 99 only
//	log     logs a warning with a field at Configure, then as memory
//	flaky   as memory, but Stat("flaky") fails with a transient backend error
//	badcfg  its factory refuses every config
//	other-kind  serves no object store service
//	host    not a plugin: a host running a memory plugin (see TestNoOrphanPlugin)
const modeArg = "pluginhost-test-mode="

func TestMain(m *testing.M) {
	if len(os.Args) == 2 && strings.HasPrefix(os.Args[1], modeArg) {
		servePluginMode(strings.TrimPrefix(os.Args[1], modeArg))
		return
	}
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	if socketDirOnce.dir != "" {
		_ = os.RemoveAll(socketDirOnce.dir)
	}
	os.Exit(code)
}

func servePluginMode(mode string) {
	memory := func([]byte, zerolog.Logger) (objectstore.Store, error) { return objectstore.NewMemory(), nil }
	switch mode {
	case "memory":
		objectstore.ServePlugin(memory)
	case "v99":
		plugin.Serve(plugin.ServeConfig{
			Kind: objectstore.PluginKind, Version: 99,
			Plugin: &objectstore.GRPCPlugin{Factory: memory, Log: plugin.Logger()},
		})
	case "log":
		objectstore.ServePlugin(func(cfg []byte, log zerolog.Logger) (objectstore.Store, error) {
			log.Debug().Msg("debug line the host must drop")
			log.Warn().Str("answer", "forty-two").RawJSON("config", cfg).Msg("hello from the plugin")
			fmt.Fprintln(os.Stderr, "a plain stderr line")
			return objectstore.NewMemory(), nil
		})
	case "flaky":
		objectstore.ServePlugin(func([]byte, zerolog.Logger) (objectstore.Store, error) {
			return flakyStore{objectstore.NewMemory()}, nil
		})
	case "host":
		// Not a plugin: a host that starts the memory plugin, prints its
		// pid, and waits to be killed.
		spec := Spec{Name: "orphan", Path: os.Args[0], Args: []string{modeArg + "memory"}}
		st, err := OpenObjectStore(context.Background(), spec, zerolog.Nop())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(st.PID())
		select {}
	case "other-kind":
		// Speaks the object store protocol version but registers no object
		// store service, as a plugin of another contract would.
		plugin.Serve(plugin.ServeConfig{
			Kind: objectstore.PluginKind, Version: objectstore.PluginProtocolVersion,
			Plugin: otherKindPlugin{},
		})
	case "badcfg":
		objectstore.ServePlugin(func(cfg []byte, _ zerolog.Logger) (objectstore.Store, error) {
			return nil, errors.New("badcfg: root is required")
		})
	default:
		fmt.Fprintf(os.Stderr, "unknown test plugin mode %q\n", mode)
		os.Exit(2)
	}
}

// otherKindPlugin registers no service.
type otherKindPlugin struct {
	goplugin.NetRPCUnsupportedPlugin
}

func (otherKindPlugin) GRPCServer(*goplugin.GRPCBroker, *grpc.Server) error { return nil }
func (otherKindPlugin) GRPCClient(context.Context, *goplugin.GRPCBroker, *grpc.ClientConn) (any, error) {
	return nil, errors.New("unused")
}

// flakyStore fails Stat of the key "flaky" as a throttled backend would.
type flakyStore struct{ *objectstore.Memory }

func (f flakyStore) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	if key == "flaky" {
		return objectstore.ObjectInfo{}, objectstore.Transient(errors.New("backend: 503 slow down"))
	}
	return f.Memory.Stat(ctx, key)
}

// selfSpec runs this test binary as a plugin in the given mode.
func selfSpec(t testing.TB, mode string) Spec {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Spec{Name: "test-" + mode, Path: exe, Args: []string{modeArg + mode}, ConfigJSON: []byte(`{}`)}
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// plugins are built once per test binary, into a temporary directory that
// TestMain removes.
var pluginPkgs = map[string]string{
	"objectstore-memory":    "./examples/objectstore-memory",
	"strata-objectstore-fs": "./plugins/objectstore/fs/cmd/strata-objectstore-fs",
}

// buildPlugin returns the path of the named plugin binary, built with go
// build from this module, and its SHA-256.
func buildPlugin(t testing.TB, name string) (path, sum string) {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "strata-pluginhost-test-")
		if buildErr != nil {
			return
		}
		root := testbin.Root()
		// No symbol tables or DWARF: linking is most of the build time.
		args := []string{"build", "-ldflags=-s -w", "-o", buildDir + string(filepath.Separator)}
		for _, pkg := range pluginPkgs {
			if _, err := os.Stat(filepath.Join(root, pkg)); err == nil {
				args = append(args, pkg)
			}
		}
		cmd := exec.Command("go", args...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	})
	if buildErr != nil {
		t.Fatalf("building plugins: %v", buildErr)
	}
	path = filepath.Join(buildDir, name)
	if _, err := os.Stat(path); err != nil {
		t.Skipf("plugin %s not built (package %s missing?): %v", name, pluginPkgs[name], err)
	}
	sum, err := FileSHA256(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, sum
}

// testLog returns a zerolog logger into the test log.
func testLog(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

func openExternal(t testing.TB, spec Spec) *ObjectStore {
	t.Helper()
	st, err := OpenObjectStore(context.Background(), spec, testLog(t))
	if err != nil {
		t.Fatalf("OpenObjectStore(%s): %v", spec.Name, err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}
