package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestJSONAndLevel(t *testing.T) {
	var buf bytes.Buffer
	log, err := New(&buf, "info", FormatJSON)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug().Msg("hidden")
	log.Info().Str("component", "x").Msg("shown")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("want 1 line, got %q", buf.String())
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &m); err != nil {
		t.Fatal(err)
	}
	if m["message"] != "shown" || m["component"] != "x" || m["level"] != "info" {
		t.Fatalf("bad record %v", m)
	}
}

func TestBadSettings(t *testing.T) {
	if _, err := New(&bytes.Buffer{}, "loud", FormatJSON); err == nil || !strings.Contains(err.Error(), "loud") {
		t.Fatalf("level error = %v", err)
	}
	if _, err := New(&bytes.Buffer{}, "info", "xml"); err == nil || !strings.Contains(err.Error(), "xml") {
		t.Fatalf("format error = %v", err)
	}
}
