package procfs

import (
	"errors"
	"io/fs"
	"os"
	"testing"
)

func TestParseStat(t *testing.T) {
	// A name with spaces and parentheses, as a process may give itself.
	line := "4242 (a (b) c) S 17 4242 4242 0 -1 4194560 120 0 0 0 30 12 5 3 20 0 1 0 987654 1000 200 18446744073709551615\n"
	s, err := ParseStat(line)
	if err != nil {
		t.Fatal(err)
	}
	want := Stat{PID: 4242, Comm: "a (b) c", State: 'S', PPID: 17, Session: 4242, Ticks: 30 + 12 + 5 + 3, StartTime: 987654}
	if s != want {
		t.Fatalf("ParseStat = %+v, want %+v", s, want)
	}
	for _, bad := range []string{
		"",
		"4242 a S 17",                      // no parentheses
		"4242 (x) S 17 1 1 0 -1 0 0 0 0 0", // cut short
		"x (y) S 17 4242 4242 0 -1 4194560 120 0 0 0 30 12 5 3 20 0 1 0 987654",
		"4242 (y) S 17 4242 4242 0 -1 4194560 120 0 0 0 30 12 5 3 20 0 1 0 soon",
	} {
		if _, err := ParseStat(bad); !errors.Is(err, ErrFormat) {
			t.Errorf("ParseStat(%q): %v, want ErrFormat", bad, err)
		}
	}
}

func TestReadStat(t *testing.T) {
	s, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if s.PID != os.Getpid() || s.PPID != os.Getppid() || s.State == 0 || s.StartTime == 0 {
		t.Fatalf("own stat: %+v (ppid %d)", s, os.Getppid())
	}
	if _, err := ReadStat(1 << 30); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a PID that does not exist: %v, want fs.ErrNotExist", err)
	}
}
