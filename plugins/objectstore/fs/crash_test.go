package fs

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

const crashRootEnv = "STRATA_FS_CRASH_ROOT"

type blockForever struct{}

func (blockForever) Read([]byte) (int, error) { select {} }

// TestCrashHelper is the process that TestCrashMidPut kills: it starts two
// Puts whose bodies stop after 1 MiB and never end.
func TestCrashHelper(t *testing.T) {
	root := os.Getenv(crashRootEnv)
	if root == "" {
		t.Skip("the helper process of TestCrashMidPut")
	}
	s, err := New(Config{Root: root}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		cond bool
	}{{"crash/existing", false}, {"crash/new", true}} {
		go func() {
			r := io.MultiReader(storetest.Pattern{Seed: 9}.Reader(1<<20), blockForever{})
			s.Put(context.Background(), c.key, r, objectstore.PutOptions{Size: -1, IfNotExists: c.cond})
		}()
	}
	select {} // until killed
}

// TestCrashMidPut kills -9 a process in the middle of two Puts (an
// overwrite and a conditional create), then opens the root again: the old
// object is intact, the new one does not exist, and the dead process's
// temporary files are gone.
func TestCrashMidPut(t *testing.T) {
	root := t.TempDir()
	s := open(t, Config{Root: root})
	old := []byte("the durable old version")
	put(t, s, "crash/existing", string(old))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashHelper$")
	cmd.Env = append(os.Environ(), crashRootEnv+"="+root)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	// Wait until both temporary files hold their first MiB.
	deadline := time.Now().Add(time.Minute)
	for {
		full := 0
		for _, f := range tmpFiles(t, root) {
			if st, err := os.Stat(f); err == nil && st.Size() >= 1<<20 {
				full++
			}
		}
		if full == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the helper did not write two 1 MiB temporary files within a minute: %q", tmpFiles(t, root))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	cmd.Wait()
	killed = true
	if n := len(tmpFiles(t, root)); n != 2 {
		t.Fatalf("after the crash: %d temporary files, want the 2 partial ones", n)
	}

	s2 := open(t, Config{Root: root})
	defer s2.Close()
	if tf := tmpFiles(t, root); len(tf) != 0 {
		t.Fatalf("New did not remove the crashed process's temporary files: %q", tf)
	}
	rc, err := s2.Get(context.Background(), "crash/existing")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != string(old) {
		t.Fatalf("after a crash mid-overwrite: %d bytes, want the old %d", len(got), len(old))
	}
	if _, err := s2.Stat(context.Background(), "crash/new"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("a conditional create killed half-way is visible: Stat = %v", err)
	}
	if got := keys(t, s2, ""); strings.Join(got, ",") != "crash/existing" {
		t.Fatalf("List after the crash = %q", got)
	}
	// Only the live store's area remains.
	entries, _ := os.ReadDir(filepath.Join(root, tmpDirNam))
	if len(entries) != 2 {
		t.Fatalf("temporary area after recovery holds %d entries, want the new store's lock and directory", len(entries))
	}
}
