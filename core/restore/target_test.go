package restore

import (
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/pg"
)

// TestParseTarget: LSNs, the time forms people type and Postgres prints,
// and clear refusals.
func TestParseTarget(t *testing.T) {
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	local := func(s string) time.Time {
		v, err := time.ParseInLocation("2006-01-02 15:04:05.999999", s, time.Local)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		in   string
		want Target
	}{
		{"0/622E830", Target{LSN: pg.LSN(0x622E830)}},
		{"latest", Target{Latest: true}},
		{" 16/B374D848 ", Target{LSN: pg.LSN(0x16B374D848)}},
		{"2026-12-06T13:17:14Z", Target{Time: utc("2026-12-06T13:17:14Z")}},
		{"2026-12-06T13:17:14.5+01:00", Target{Time: utc("2026-12-06T12:17:14.5Z")}},
		{"2026-12-06 13:17:14Z", Target{Time: utc("2026-12-06T13:17:14Z")}},
		{"2026-12-06 13:17:14 +02:00", Target{Time: utc("2026-12-06T11:17:14Z")}},
		{"2026-12-06 13:17:13.362756+00", Target{Time: utc("2026-12-06T13:17:13.362756Z")}},
		{"2026-12-06 13:17:13.362756-0300", Target{Time: utc("2026-12-06T16:17:13.362756Z")}},
		{"2026-12-06 13:17:14", Target{Time: local("2026-12-06 13:17:14")}},
		{"2026-12-06 13:17:14.25", Target{Time: local("2026-12-06 13:17:14.25")}},
		{"2026-12-06 13:17", Target{Time: local("2026-12-06 13:17:00")}},
	} {
		got, err := ParseTarget(c.in)
		if err != nil {
			t.Errorf("ParseTarget(%q): %v", c.in, err)
			continue
		}
		if got.LSN != c.want.LSN || !got.Time.Equal(c.want.Time) || got.Latest != c.want.Latest {
			t.Errorf("ParseTarget(%q) = %v (%v), want %v (%v)", c.in, got, got.Time, c.want, c.want.Time)
		}
	}
	for _, in := range []string{"", "0/0", "yesterday", "0/XYZ", "2026-13-06 10:00:00", "13:17:14"} {
		if got, err := ParseTarget(in); err == nil {
			t.Errorf("ParseTarget(%q) = %v, want an error", in, got)
		}
	}
}
