package pgtest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStartQueryKillRestart(t *testing.T) {
	s := Start(t, Options{Conf: map[string]string{"shared_buffers": "32MB"}})
	s.Exec("postgres", "CREATE TABLE t(a int); INSERT INTO t VALUES (41)")
	if got := s.QueryString("postgres", "SELECT (a+1)::text FROM t"); got != "42" {
		t.Fatalf("got %q", got)
	}
	s.Kill9()
	if s.PID() != 0 {
		t.Fatal("pid after kill")
	}
	s.Launch() // crash recovery
	if got := s.QueryString("postgres", "SELECT count(*)::text FROM t"); got != "1" {
		t.Fatalf("after crash: %q", got)
	}
}

// TestTemplateCopies: with TemplatesEnv set, the servers are copies of one
// initdb output, each with a system identifier of its own in pg_control
// and in its WAL (crash recovery reads the WAL and would refuse another
// system's), and a copy does not change the template.
func TestTemplateCopies(t *testing.T) {
	root := filepath.Join(MkdirOwned(t, "strata-pg-templates-"), "templates")
	t.Setenv(TemplatesEnv, root)
	ids := map[string]bool{}
	for i := 0; i < 2; i++ {
		s := Start(t, Options{Conf: map[string]string{"shared_buffers": "32MB"}})
		s.Exec("postgres", "CREATE TABLE t(a int); INSERT INTO t VALUES (1)")
		s.Kill9()
		s.Launch() // crash recovery over the copy's WAL
		if got := s.QueryString("postgres", "SELECT count(*)::text FROM t"); got != "1" {
			t.Fatalf("server %d after crash: %q", i, got)
		}
		id := s.QueryString("postgres", "SELECT system_identifier::text FROM pg_control_system()")
		if ids[id] {
			t.Fatalf("server %d has the system identifier %s of an earlier copy", i, id)
		}
		ids[id] = true
		if cd := ControlData(t, s.DataDir); cd["Database system identifier"] != id {
			t.Fatalf("pg_controldata says %q, the server %s", cd["Database system identifier"], id)
		}
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || strings.HasPrefix(ents[0].Name(), "new-") {
		t.Fatalf("template folder holds %v, want one template", ents)
	}
	tmpl := filepath.Join(root, ents[0].Name(), "data")
	cd := ControlData(t, tmpl)
	if ids[cd["Database system identifier"]] {
		t.Fatalf("a copy kept the template's system identifier %s", cd["Database system identifier"])
	}
	if cd["Database cluster state"] != "shut down" {
		t.Fatalf("the template's state: %q", cd["Database cluster state"])
	}
	if _, err := os.Stat(filepath.Join(tmpl, "postmaster.pid")); err == nil {
		t.Fatal("a server ran on the template")
	}
}
