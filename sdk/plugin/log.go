package plugin

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// hclogTimeFormat is the timestamp layout go-plugin's host parses.
const hclogTimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// NewLogger returns a zerolog logger that writes each event to w as one line
// of hclog JSON ("@level", "@message", "@timestamp" and the event's own
// fields), the format go-plugin's host forwards with the level intact.
func NewLogger(w io.Writer) zerolog.Logger {
	return zerolog.New(&hclogWriter{w: w}).With().Timestamp().Logger()
}

// hclogWriter rewrites zerolog JSON events into hclog JSON lines.
type hclogWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (h *hclogWriter) Write(p []byte) (int, error) {
	line, err := toHCLogJSON(p)
	if err != nil {
		// Not a JSON object: pass it through; the host logs it verbatim.
		line = p
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, err := h.w.Write(line); err != nil {
		return 0, err
	}
	return len(p), nil
}

func toHCLogJSON(p []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(p))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return nil, err
	}
	if lvl, ok := m[zerolog.LevelFieldName].(string); ok {
		delete(m, zerolog.LevelFieldName)
		switch lvl {
		case "fatal", "panic":
			lvl = "error"
		}
		m["@level"] = lvl
	} else {
		m["@level"] = "info"
	}
	if msg, ok := m[zerolog.MessageFieldName].(string); ok {
		delete(m, zerolog.MessageFieldName)
		m["@message"] = msg
	} else {
		m["@message"] = ""
	}
	if ts, ok := m[zerolog.TimestampFieldName].(string); ok {
		delete(m, zerolog.TimestampFieldName)
		if t, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			m["@timestamp"] = t.Format(hclogTimeFormat)
		}
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}
