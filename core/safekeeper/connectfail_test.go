package safekeeper

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// TestConnectFailuresLog: a run of refused replication connections (one
// every 500 ms) is said once at info, at warn once it has lasted 30 s,
// then once per 30 s with the attempts; a new run starts at info again.
func TestConnectFailuresLog(t *testing.T) {
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	err := errors.New("dial tcp 127.0.0.1:25432: connect: connection refused")
	var c connectFailures
	t0 := time.Unix(1_800_000_000, 0)
	for i := range 200 { // 100 s of failures
		c.note(log, t0.Add(time.Duration(i)*500*time.Millisecond), err)
	}
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{`"level":"info"`, `"level":"warn","error":"dial tcp`, `"level":"warn"`, `"level":"warn"`}
	if len(lines) != len(want) {
		t.Fatalf("%d lines for 100 s of refusals, want %d:\n%s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("line %d: %s, want %s", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[1], `"attempts":61`) || !strings.Contains(lines[1], `"for":"30s"`) {
		t.Errorf("the first warning: %s, want 61 attempts over 30s", lines[1])
	}
	buf.Reset()
	c = connectFailures{} // a session streamed, or the term changed
	c.note(log, t0.Add(time.Hour), err)
	if !strings.Contains(buf.String(), `"level":"info"`) {
		t.Errorf("a new run of failures: %s, want info", buf.String())
	}
}
