package pluginhost

import (
	"bytes"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
	"github.com/rs/zerolog"
)

// hclogAdapter is an hclog.Logger that writes into a zerolog logger. go-plugin
// logs through it, and it is how a plugin's own log lines (parsed by
// go-plugin from the plugin's stderr) reach the host's log, at their level
// and with their fields.
type hclogAdapter struct {
	log   zerolog.Logger
	name  string
	args  []any
	level *hclog.Level // shared by loggers derived with With/Named
	mu    *sync.Mutex
}

// newHCLog returns an hclog.Logger over log that passes events at hclog
// level min and above (go-plugin's own chatter is mostly Debug and Trace).
func newHCLog(log zerolog.Logger, min hclog.Level) hclog.Logger {
	return &hclogAdapter{log: log, level: &min, mu: new(sync.Mutex)}
}

var _ hclog.Logger = (*hclogAdapter)(nil)

func toZerolog(l hclog.Level) zerolog.Level {
	switch l {
	case hclog.Trace:
		return zerolog.TraceLevel
	case hclog.Debug:
		return zerolog.DebugLevel
	case hclog.Warn:
		return zerolog.WarnLevel
	case hclog.Error:
		return zerolog.ErrorLevel
	case hclog.Off:
		return zerolog.Disabled
	default:
		return zerolog.InfoLevel
	}
}

func (a *hclogAdapter) Log(level hclog.Level, msg string, args ...any) {
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	if level < a.GetLevel() {
		return
	}
	ev := a.log.WithLevel(toZerolog(level))
	if ev == nil {
		return
	}
	if a.name != "" {
		ev = ev.Str("logger", a.name)
	}
	// go-plugin's own lines come from the unnamed logger; the plugin's
	// lines from one named after the binary.
	own := a.name == ""
	addPairs(ev, a.args, own)
	addPairs(ev, args, own)
	ev.Msg(msg)
}

// addPairs adds hclog key/value pairs to ev. Keys the host sets itself
// (plugin, kind, level, message) get a "plugin_" prefix, except go-plugin's
// own "plugin" (the binary path), which becomes "binary".
func addPairs(ev *zerolog.Event, args []any, goPluginOwn bool) {
	for i := 0; i < len(args); i += 2 {
		if i+1 == len(args) {
			ev.Interface("EXTRA_VALUE_AT_END", args[i])
			break
		}
		k := fmt.Sprint(args[i])
		switch k {
		case "timestamp":
			continue // the host stamps its own time
		case "plugin":
			if goPluginOwn {
				k = "binary"
			} else {
				k = "plugin_plugin"
			}
		case "kind", zerolog.TimestampFieldName, zerolog.LevelFieldName, zerolog.MessageFieldName:
			k = "plugin_" + k
		}
		switch v := args[i+1].(type) {
		case error:
			ev.AnErr(k, v)
		case hclog.Format:
			if len(v) > 0 {
				ev.Str(k, fmt.Sprintf(fmt.Sprint(v[0]), v[1:]...))
			}
		case fmt.Stringer:
			ev.Stringer(k, v)
		default:
			ev.Interface(k, v)
		}
	}
}

func (a *hclogAdapter) Trace(msg string, args ...any) { a.Log(hclog.Trace, msg, args...) }
func (a *hclogAdapter) Debug(msg string, args ...any) { a.Log(hclog.Debug, msg, args...) }
func (a *hclogAdapter) Info(msg string, args ...any)  { a.Log(hclog.Info, msg, args...) }
func (a *hclogAdapter) Warn(msg string, args ...any)  { a.Log(hclog.Warn, msg, args...) }
func (a *hclogAdapter) Error(msg string, args ...any) { a.Log(hclog.Error, msg, args...) }

func (a *hclogAdapter) enabled(l hclog.Level) bool {
	return l >= a.GetLevel() && toZerolog(l) >= a.log.GetLevel() && toZerolog(l) >= zerolog.GlobalLevel()
}

func (a *hclogAdapter) IsTrace() bool { return a.enabled(hclog.Trace) }
func (a *hclogAdapter) IsDebug() bool { return a.enabled(hclog.Debug) }
func (a *hclogAdapter) IsInfo() bool  { return a.enabled(hclog.Info) }
func (a *hclogAdapter) IsWarn() bool  { return a.enabled(hclog.Warn) }
func (a *hclogAdapter) IsError() bool { return a.enabled(hclog.Error) }

func (a *hclogAdapter) ImpliedArgs() []any { return a.args }

func (a *hclogAdapter) With(args ...any) hclog.Logger {
	c := *a
	c.args = append(append([]any(nil), a.args...), args...)
	return &c
}

func (a *hclogAdapter) Name() string { return a.name }

func (a *hclogAdapter) Named(name string) hclog.Logger {
	c := *a
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	return &c
}

func (a *hclogAdapter) ResetNamed(name string) hclog.Logger {
	c := *a
	c.name = name
	return &c
}

// SetLevel sets the minimum level of this logger and of every logger
// derived from it.
func (a *hclogAdapter) SetLevel(l hclog.Level) {
	a.mu.Lock()
	defer a.mu.Unlock()
	*a.level = l
}

// GetLevel is the level go-plugin checks before it parses a plugin's log
// line: the stricter of this adapter's minimum and the zerolog logger's.
func (a *hclogAdapter) GetLevel() hclog.Level {
	a.mu.Lock()
	l := *a.level
	a.mu.Unlock()
	var z hclog.Level
	switch max(a.log.GetLevel(), zerolog.GlobalLevel()) {
	case zerolog.TraceLevel:
		z = hclog.Trace
	case zerolog.DebugLevel:
		z = hclog.Debug
	case zerolog.InfoLevel:
		z = hclog.Info
	case zerolog.WarnLevel:
		z = hclog.Warn
	case zerolog.ErrorLevel, zerolog.FatalLevel, zerolog.PanicLevel:
		z = hclog.Error
	default:
		z = hclog.Off
	}
	return max(l, z)
}

func (a *hclogAdapter) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(a.StandardWriter(opts), "", 0)
}

func (a *hclogAdapter) StandardWriter(opts *hclog.StandardLoggerOptions) io.Writer {
	infer := opts != nil && (opts.InferLevels || opts.InferLevelsWithTimestamp)
	return &lineWriter{emit: func(line string) {
		level := hclog.Info
		if infer {
			level, line = inferLevel(line)
		}
		a.Log(level, line)
	}}
}

func inferLevel(line string) (hclog.Level, string) {
	for _, p := range []struct {
		prefix string
		level  hclog.Level
	}{
		{"[TRACE]", hclog.Trace}, {"[DEBUG]", hclog.Debug}, {"[INFO]", hclog.Info},
		{"[WARN]", hclog.Warn}, {"[ERROR]", hclog.Error}, {"[ERR]", hclog.Error},
	} {
		if i := strings.Index(line, p.prefix); i >= 0 {
			return p.level, strings.TrimSpace(line[i+len(p.prefix):])
		}
	}
	return hclog.Info, line
}

// lineWriter calls emit once per complete line written to it.
type lineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	emit func(line string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		i := bytes.IndexByte(w.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := string(bytes.TrimRight(w.buf.Next(i+1), "\r\n"))
		if line != "" {
			w.emit(line)
		}
	}
	return len(p), nil
}
