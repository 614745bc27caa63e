package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestPageserverBench runs `strata pageserver bench` briefly in process and
// checks that it reports every mode without errors.
func TestPageserverBench(t *testing.T) {
	cmd := newPageserverBenchCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs([]string{"--pages", "64", "--clients", "2", "--duration", "300ms", "--layer-target-size", "65536"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("output:\n%s", out.String())
	}
	for i, mode := range []string{"cached", "uncached", "cold"} {
		if !strings.HasPrefix(lines[i], mode+" ") || !strings.Contains(lines[i], "errors=0") || !strings.Contains(lines[i], "p99 ") {
			t.Errorf("line %d: %q", i, lines[i])
		}
	}
	if !strings.Contains(errOut.String(), "evicted") {
		t.Errorf("no eviction reported: %q", errOut.String())
	}
}
