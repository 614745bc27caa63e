package pgtest

import "testing"

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
