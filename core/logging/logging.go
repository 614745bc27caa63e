// Package logging builds the zerolog logger that a strata process passes down
// to everything it starts. There is no global logger: constructors take one.
package logging

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// Formats accepted by New.
const (
	FormatJSON    = "json"
	FormatConsole = "console"
	FormatAuto    = "auto" // console on a terminal, JSON otherwise
)

// New returns a logger writing to w at the given level ("debug", "info",
// "warn", "error") in the given format.
func New(w io.Writer, level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("logging: level %q: want debug, info, warn or error", level)
	}
	switch format {
	case FormatJSON:
	case FormatConsole:
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	case FormatAuto, "":
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
		}
	default:
		return zerolog.Nop(), fmt.Errorf("logging: format %q: want json, console or auto", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
