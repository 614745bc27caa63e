package pluginhost

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/rs/zerolog"
)

func decodeLines(t *testing.T, b []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range bytes.Split(bytes.TrimSpace(b), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("not JSON: %s", l)
		}
		out = append(out, m)
	}
	return out
}

func TestHCLogAdapter(t *testing.T) {
	var buf bytes.Buffer
	zl := zerolog.New(&buf).Level(zerolog.InfoLevel).With().Str("plugin", "fs").Logger()
	h := newHCLog(zl, hclog.Trace)

	if h.GetLevel() != hclog.Info || h.IsDebug() || !h.IsInfo() {
		t.Fatalf("level: GetLevel %v, IsDebug %v: the zerolog logger's Info level must show", h.GetLevel(), h.IsDebug())
	}
	h.Debug("dropped")
	named := h.Named("strata-objectstore-fs").With("req", 7)
	named.Warn("slow", "err", errors.New("disk"), "plugin", "x", "timestamp", "2026", "fmt", hclog.Fmt("%d%%", 50))
	h.Error("go-plugin line", "plugin", "/usr/bin/p")
	h.Log(hclog.NoLevel, "no level")
	h.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}).Print("[ERROR] from stdlog")

	lines := decodeLines(t, buf.Bytes())
	if len(lines) != 4 {
		t.Fatalf("got %d lines, want 4 (the Debug one dropped):\n%s", len(lines), buf.Bytes())
	}
	w := lines[0]
	if w["level"] != "warn" || w["message"] != "slow" || w["plugin"] != "fs" || w["logger"] != "strata-objectstore-fs" ||
		w["req"] != float64(7) || w["err"] != "disk" || w["plugin_plugin"] != "x" || w["fmt"] != "50%" {
		t.Fatalf("warn line: %v", w)
	}
	if _, ok := w["timestamp"]; ok {
		t.Fatalf("timestamp pair should be dropped: %v", w)
	}
	if e := lines[1]; e["level"] != "error" || e["binary"] != "/usr/bin/p" || e["plugin"] != "fs" {
		t.Fatalf("go-plugin line: %v", e)
	}
	if lines[2]["level"] != "info" {
		t.Fatalf("NoLevel line: %v", lines[2])
	}
	if s := lines[3]; s["level"] != "error" || !strings.Contains(s["message"].(string), "from stdlog") {
		t.Fatalf("stdlog line: %v", s)
	}

	h.SetLevel(hclog.Error)
	if named.GetLevel() != hclog.Error {
		t.Fatal("SetLevel must reach derived loggers")
	}
	buf.Reset()
	named.Warn("now dropped")
	if buf.Len() != 0 {
		t.Fatalf("Warn below the level was written: %s", buf.Bytes())
	}
}
