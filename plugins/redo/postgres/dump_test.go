package postgres

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
)

var statsRow = regexp.MustCompile(`^(\S.*?)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s+(\d+)\s+\(\s*[\d.]+\)\s*$`)

type statsLine struct{ n, rec, fpi uint64 }

func parseStats(t *testing.T, out string) map[string]statsLine {
	t.Helper()
	m := map[string]statsLine{}
	for _, line := range strings.Split(out, "\n") {
		g := statsRow.FindStringSubmatch(line)
		if g == nil {
			continue
		}
		n, _ := strconv.ParseUint(g[2], 10, 64)
		rec, _ := strconv.ParseUint(g[3], 10, 64)
		fpi, _ := strconv.ParseUint(g[4], 10, 64)
		m[g[1]] = statsLine{n, rec, fpi}
	}
	return m
}

// TestStatsMatchPgWaldump compares strata's --stats output with
// pg_waldump's on the same WAL, per rmgr and per record type.
func TestStatsMatchPgWaldump(t *testing.T) {
	w := sharedWAL(t)
	for _, perRecord := range []bool{false, true} {
		mode := "--stats"
		if perRecord {
			mode = "--stats=record"
		}
		cmd, err := pgtest.Command("pg_waldump", "-p", w.Dir, "-s", w.Start.String(), "-e", w.End.String(), mode)
		if err != nil {
			t.Fatal(err)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("pg_waldump: %v\n%s", err, out)
		}
		theirs := parseStats(t, string(out))
		src, err := wal.OpenDir(w.Dir)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := Dump(&b, src, DumpOptions{Start: w.Start, End: w.End, Stats: true, PerRecord: perRecord}); err != nil {
			t.Fatal(err)
		}
		src.Close()
		ours := parseStats(t, b.String())
		if len(theirs) < 5 {
			t.Fatalf("pg_waldump %s printed too little:\n%s", mode, out)
		}
		for name, th := range theirs {
			if ours[name] != th {
				t.Errorf("%s %s: strata %+v, pg_waldump %+v", mode, name, ours[name], th)
			}
		}
		for name, o := range ours {
			if _, ok := theirs[name]; !ok && o.n > 0 {
				t.Errorf("%s %s: strata counts %d records, pg_waldump none", mode, name, o.n)
			}
		}
		// The header lines (WAL statistics between X and Y) must agree too.
		if hdr := strings.SplitN(string(out), "\n", 2)[0]; !strings.Contains(b.String(), hdr) {
			t.Errorf("header differs: pg_waldump %q, strata %q", hdr, strings.SplitN(b.String(), "\n", 2)[0])
		}
		if perRecord {
			t.Logf("strata %s:\n%s", mode, b.String())
		}
	}
}

// TestDumpMatchesPgWaldumpLines compares record lines up to the description
// (rmgr, lengths, xid, LSNs, record type) and the block references.
func TestDumpMatchesPgWaldumpLines(t *testing.T) {
	w := sharedWAL(t)
	cmd, err := pgtest.Command("pg_waldump", "-p", w.Dir, "-s", w.Start.String(), "-e", w.End.String(), "-n", "3000")
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pg_waldump: %v\n%s", err, stderr.String())
	}
	src, err := wal.OpenDir(w.Dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var b bytes.Buffer
	if err := Dump(&b, src, DumpOptions{Start: w.Start, End: w.End, Limit: 3000}); err != nil {
		t.Fatal(err)
	}
	theirs := strings.Split(strings.TrimSpace(string(out)), "\n")
	ours := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(theirs) != len(ours) {
		t.Fatalf("pg_waldump printed %d lines, strata %d", len(theirs), len(ours))
	}
	exact := 0
	for i := range theirs {
		tp, op := splitDesc(theirs[i]), splitDesc(ours[i])
		if tp[0] != op[0] || tp[2] != op[2] {
			t.Fatalf("line %d differs:\npg_waldump: %s\nstrata:     %s", i, theirs[i], ours[i])
		}
		if theirs[i] == ours[i] {
			exact++
		} else if i-exact < 8 {
			t.Logf("description differs:\npg_waldump: %s\nstrata:     %s", theirs[i], ours[i])
		}
	}
	t.Logf("%d of %d lines identical to pg_waldump's (descriptions of some rmgrs are not reproduced)", exact, len(theirs))
	if exact < len(theirs)/2 {
		t.Errorf("only %d of %d lines identical", exact, len(theirs))
	}
}

// splitDesc splits a dump line into prefix (up to and including the record
// type), description, and block references.
func splitDesc(line string) [3]string {
	var out [3]string
	i := strings.Index(line, "desc: ")
	if i < 0 {
		out[0] = line
		return out
	}
	rest := line[i+6:]
	typ, desc, _ := strings.Cut(rest, " ")
	out[0] = line[:i+6] + typ
	if j := strings.Index(desc, ", blkref #"); j >= 0 {
		out[1], out[2] = desc[:j], desc[j:]
	} else {
		out[1] = desc
	}
	return out
}
