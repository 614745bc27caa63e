package pluginhost

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSocketDirSweep: the folder of a process that is gone is removed, the
// folder of one that runs is kept, and this process gets its own.
func TestSocketDirSweep(t *testing.T) {
	base := filepath.Join(t.TempDir(), "sockets")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{strconv.Itoa(gone.Process.Pid), strconv.Itoa(os.Getppid()), "not-a-pid"} {
		if err := os.MkdirAll(filepath.Join(base, name), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, name, "plugin123"), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := makeSocketDir(base, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if dir != filepath.Join(base, strconv.Itoa(os.Getpid())) {
		t.Fatalf("socket folder %s", dir)
	}
	var left []string
	entries, _ := os.ReadDir(base)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	want := []string{strconv.Itoa(os.Getppid()), strconv.Itoa(os.Getpid()), "not-a-pid"}
	for _, w := range want {
		if !strings.Contains(" "+strings.Join(left, " ")+" ", " "+w+" ") {
			t.Fatalf("after the sweep %v, want %v (the gone process %d removed)", left, want, gone.Process.Pid)
		}
	}
	if len(left) != len(want) {
		t.Fatalf("after the sweep %v, want %v (the gone process %d removed)", left, want, gone.Process.Pid)
	}
	if fi, err := os.Stat(base); err != nil || fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Fatalf("base folder mode %v, %v; want a sticky 0777 folder like /tmp", fi.Mode(), err)
	}
}

// TestPluginSocketInPrivateFolder: a plugin's socket is created in this
// process's folder, so one that is killed leaves nothing in the temporary
// folder itself.
func TestPluginSocketInPrivateFolder(t *testing.T) {
	dir, err := socketDir()
	if err != nil {
		t.Fatal(err)
	}
	sockets := func() map[string]bool {
		out := map[string]bool{}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "plugin") && e.Type()&os.ModeSocket != 0 {
				out[e.Name()] = true
			}
		}
		return out
	}
	before := sockets()
	openExternal(t, selfSpec(t, "memory"))
	for name := range sockets() {
		if !before[name] {
			return
		}
	}
	t.Fatalf("the plugin's socket is not in %s (before %v, after %v)", dir, before, sockets())
}
