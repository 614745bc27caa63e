package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

var (
	errA = errors.New("contract: a")
	errB = errors.New("contract: b")
)

type marked struct{ err error }

func (m *marked) Error() string   { return m.err.Error() }
func (m *marked) Unwrap() []error { return []error{m.err, errB} }

var testMap = ErrorMap{
	{Code: codes.NotFound, Sentinel: errA},
	{Code: codes.Unavailable, Sentinel: errB, Wrap: func(err error) error { return &marked{err} }},
}

func TestErrorMapRoundTrip(t *testing.T) {
	cases := []struct {
		in       error
		code     codes.Code
		matches  []error
		excludes []error
	}{
		{fmt.Errorf("x: %w", errA), codes.NotFound, []error{errA}, []error{errB, context.Canceled}},
		{&marked{errors.New("slow down")}, codes.Unavailable, []error{errB}, []error{errA}},
		{fmt.Errorf("op: %w", context.Canceled), codes.Canceled, []error{context.Canceled}, []error{errA, errB}},
		// The context error wins over a contract sentinel wrapped around it.
		{&marked{context.DeadlineExceeded}, codes.DeadlineExceeded, []error{context.DeadlineExceeded}, []error{errA}},
		{errors.New("plain"), codes.Unknown, nil, []error{errA, errB, context.Canceled}},
		{status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied, nil, []error{errA, errB}},
	}
	for _, tc := range cases {
		st := testMap.ToStatus(tc.in)
		if got := status.Code(st); got != tc.code {
			t.Errorf("ToStatus(%v): code %v, want %v", tc.in, got, tc.code)
		}
		back := testMap.FromStatus(st)
		if back.Error() != tc.in.Error() && tc.code != codes.PermissionDenied {
			t.Errorf("round trip of %q: text %q", tc.in, back.Error())
		}
		for _, m := range tc.matches {
			if !errors.Is(back, m) {
				t.Errorf("round trip of %v: does not match %v", tc.in, m)
			}
		}
		for _, m := range tc.excludes {
			if errors.Is(back, m) {
				t.Errorf("round trip of %v: matches %v", tc.in, m)
			}
		}
		if got := status.Code(back); got != tc.code {
			t.Errorf("round trip of %v: status.Code %v, want %v", tc.in, got, tc.code)
		}
	}
	if testMap.ToStatus(nil) != nil || testMap.FromStatus(nil) != nil {
		t.Fatal("nil must map to nil")
	}
	plain := errors.New("not a status")
	if testMap.FromStatus(plain) != plain {
		t.Fatal("FromStatus must return a non-status error unchanged")
	}
}

func TestNewLoggerWritesHCLogJSON(t *testing.T) {
	var buf bytes.Buffer
	log := NewLogger(&buf)
	log.Warn().Str("key", "v").Int("n", 3).Msg("hello")
	log.Error().Err(errors.New("boom")).Msg("bad")
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %s", len(lines), buf.Bytes())
	}
	var m map[string]any
	if err := json.Unmarshal(lines[0], &m); err != nil {
		t.Fatal(err)
	}
	if m["@level"] != "warn" || m["@message"] != "hello" || m["key"] != "v" || m["n"] != float64(3) {
		t.Fatalf("line %s", lines[0])
	}
	ts, _ := m["@timestamp"].(string)
	if _, err := time.Parse(hclogTimeFormat, ts); err != nil {
		t.Fatalf("@timestamp %q does not parse as go-plugin expects: %v", ts, err)
	}
	for _, k := range []string{zerolog.LevelFieldName, zerolog.MessageFieldName, zerolog.TimestampFieldName} {
		if _, ok := m[k]; ok {
			t.Errorf("zerolog field %q left in the line", k)
		}
	}
	if err := json.Unmarshal(lines[1], &m); err != nil || m["@level"] != "error" || m["error"] != "boom" {
		t.Fatalf("line %s (%v)", lines[1], err)
	}
}
