package fusefs

import (
	"os/exec"
	"strings"
	"testing"
)

// TestChildrenDoNotInheritTheFUSEConnection: a program started after the
// mount (Postgres, in the agent) must not hold /dev/fuse, or a dead agent
// leaves it hanging on PGDATA instead of failing.
func TestChildrenDoNotInheritTheFUSEConnection(t *testing.T) {
	e := newEnv(t)
	e.mount(t, NewMemory(), nil)
	out, err := exec.Command("sh", "-c", "ls -l /proc/$$/fd").CombinedOutput()
	if err != nil {
		t.Fatalf("ls: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "/dev/fuse") {
		t.Fatalf("a child process inherited the FUSE connection:\n%s", out)
	}
}
