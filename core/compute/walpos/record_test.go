package walpos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"syscall"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

const pgBin = "/usr/lib/postgresql/15/bin"

// realWAL runs initdb (as the postgres OS user when root) and returns its
// first WAL segment and the records pg_waldump finds in it.
func realWAL(t testing.TB) (seg []byte, segStart pg.LSN, recs []walRec) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(pgBin, "initdb")); err != nil {
		t.Skip("PostgreSQL 15 not installed")
	}
	dir, err := os.MkdirTemp("", "strata-walpos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	data := filepath.Join(dir, "data")
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root without a postgres OS user")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	run := func(name string, args ...string) []byte {
		cmd := exec.Command(filepath.Join(pgBin, name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		cmd.Env = append(os.Environ(), "LC_ALL=C.UTF-8")
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil && name != "pg_waldump" { // pg_waldump fails at the end of WAL
			t.Fatalf("%s: %v\n%s", name, err, errb.String())
		}
		return out.Bytes()
	}
	run("initdb", "-D", data, "--no-sync", "-A", "trust", "-U", "postgres")
	name := "000000010000000000000001"
	seg, err = os.ReadFile(filepath.Join(data, "pg_wal", name))
	if err != nil {
		t.Fatal(err)
	}
	out := run("pg_waldump", "-p", filepath.Join(data, "pg_wal"), name)
	re := regexp.MustCompile(`len \(rec/tot\):\s*\d+/\s*(\d+), .*lsn: ([0-9A-F]+/[0-9A-F]+),`)
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := re.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		tot, _ := strconv.Atoi(m[1])
		lsn, err := pg.ParseLSN(m[2])
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, walRec{start: lsn, tot: tot})
	}
	if len(recs) < 100 {
		t.Fatalf("pg_waldump found %d records", len(recs))
	}
	return seg, pg.LSN(pg.WALSegmentSize), recs
}

// recordEnds returns the end of every record, in LSN order.
func recordEnds(recs []walRec) []pg.LSN {
	var ends []pg.LSN
	for _, r := range recs {
		ends = append(ends, r.end(pg.WALSegmentSize))
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
	return ends
}

type walRec struct {
	start pg.LSN
	tot   int
}

// end computes where a record ends from its start and length, skipping the
// page headers of the pages it continues on (an independent oracle for
// LastRecordEnd: pg_waldump gives starts and lengths, not ends).
func (r walRec) end(segSize uint64) pg.LSN {
	pos, left := uint64(r.start), uint64(r.tot)
	for {
		pageEnd := (pos/PageSize + 1) * PageSize
		if pos+left <= pageEnd {
			return pg.LSN(maxAlign(pos + left))
		}
		left -= pageEnd - pos
		pos = pageEnd + shortHeaderSize
		if pageEnd%segSize == 0 {
			pos = pageEnd + longHeaderSize
		}
	}
}

// TestLastRecordEndOnRealWAL checks LastRecordEnd on initdb's WAL against
// pg_waldump: for every page-aligned write of the segment, the result is
// the highest record end inside the write, and for writes that end in the
// middle of a page whose rest is zeros (Postgres flushing up to a record
// end), exactly that record end.
func TestLastRecordEndOnRealWAL(t *testing.T) {
	seg, segStart, recs := realWAL(t)
	ends := recordEnds(recs)
	walEnd := ends[len(ends)-1]
	pages := int((uint64(walEnd) - uint64(segStart) + PageSize - 1) / PageSize) // pages holding WAL
	t.Logf("%d records, WAL ends at %s, %d pages", len(recs), walEnd, pages)
	oracle := func(from, to pg.LSN) (pg.LSN, bool) {
		i := sort.Search(len(ends), func(i int) bool { return ends[i] > to }) - 1
		if i < 0 || ends[i] <= from {
			return 0, false
		}
		return ends[i], true
	}
	rng := rand.New(rand.NewPCG(1, 2))
	check := func(first, n int) {
		from := segStart + pg.LSN(first*PageSize)
		to := from + pg.LSN(n*PageSize)
		got, ok := LastRecordEnd(seg[first*PageSize:(first+n)*PageSize], from, pg.WALSegmentSize)
		want, wok := oracle(from, to)
		if got != want || ok != wok {
			t.Fatalf("write of pages %d..%d (%s..%s): got %s %v, want %s %v", first, first+n-1, from, to, got, ok, want, wok)
		}
	}
	for p := 0; p < pages; p++ {
		check(p, 1)
		check(p, 1+rng.IntN(min(8, pages-p)))
	}
	// Writes that stop at a record end: the rest of the last page zeroed.
	tested := 0
	for _, e := range ends {
		off := int(uint64(e) - uint64(segStart))
		if off%PageSize == 0 {
			continue
		}
		last := off / PageSize
		first := max(0, last-rng.IntN(3))
		w := bytes.Clone(seg[first*PageSize : (last+1)*PageSize])
		clear(w[off-first*PageSize:])
		got, ok := LastRecordEnd(w, segStart+pg.LSN(first*PageSize), pg.WALSegmentSize)
		if !ok || got != e {
			t.Fatalf("write up to record end %s: got %s %v", e, got, ok)
		}
		tested++
	}
	if tested < 100 {
		t.Fatalf("only %d record ends tested", tested)
	}
	// The tracker over the whole segment written page by page reaches the
	// real end of WAL, not the end of the zero padding.
	tr := New(pg.WALSegmentSize, 0)
	for p := 0; p < pages; p++ {
		tr.WroteData("000000010000000000000001", int64(p*PageSize), seg[p*PageSize:(p+1)*PageSize])
	}
	if tr.Current() != walEnd {
		t.Fatalf("W = %s, want the end of WAL %s", tr.Current(), walEnd)
	}
}

// page builds a WAL page at lsn with the given flags, xlp_rem_len and body
// (written after the header).
func page(lsn pg.LSN, info uint16, remLen uint32, body []byte) []byte {
	p := make([]byte, PageSize)
	binary.LittleEndian.PutUint16(p[0:], PageMagic)
	binary.LittleEndian.PutUint16(p[2:], info)
	binary.LittleEndian.PutUint32(p[4:], 1)
	binary.LittleEndian.PutUint64(p[8:], uint64(lsn))
	binary.LittleEndian.PutUint32(p[16:], remLen)
	hdr := shortHeaderSize
	if info&xlpLongHeader != 0 {
		hdr = longHeaderSize
	}
	copy(p[hdr:], body)
	return p
}

func record(tot int) []byte {
	r := make([]byte, tot)
	binary.LittleEndian.PutUint32(r, uint32(tot))
	for i := 4; i < tot; i++ {
		r[i] = 0xAB
	}
	return r
}

func TestLastRecordEndSynthetic(t *testing.T) {
	seg := uint64(pg.WALSegmentSize)
	base := pg.LSN(seg) // first page of segment 1: long header
	// Two records, then zeros.
	body := append(record(50), make([]byte, 6)...) // MAXALIGN(50) = 56
	body = append(body, record(30)...)
	p0 := page(base, xlpLongHeader, 0, body)
	if got, ok := LastRecordEnd(p0, base, seg); !ok || got != base+40+56+32 {
		t.Fatalf("two records: %s %v", got, ok)
	}
	// A record that runs past the page: the end is the previous record's.
	big := record(PageSize) // longer than the page
	p0b := page(base, xlpLongHeader, 0, append(append(record(50), make([]byte, 6)...), big[:PageSize-40-56]...))
	if got, ok := LastRecordEnd(p0b, base, seg); !ok || got != base+40+56 {
		t.Fatalf("record past the page: %s %v", got, ok)
	}
	// The next page is all continuation: no record ends there, so a write of
	// both pages ends at the first page's last complete record.
	p1 := page(base+PageSize, xlpFirstIsContRecord, 3*PageSize, nil)
	if _, ok := LastRecordEnd(p1, base+PageSize, seg); ok {
		t.Fatal("continuation page reported a record end")
	}
	if got, ok := LastRecordEnd(append(bytes.Clone(p0b), p1...), base, seg); !ok || got != base+40+56 {
		t.Fatalf("write of both pages: %s %v", got, ok)
	}
	// The continuation ends on this page, followed by nothing.
	p2 := page(base+2*PageSize, xlpFirstIsContRecord, 100, nil)
	if got, ok := LastRecordEnd(p2, base+2*PageSize, seg); !ok || got != base+2*PageSize+24+104 {
		t.Fatalf("continuation end: %s %v", got, ok)
	}
	// A record ending exactly at the page end.
	p3 := page(base+3*PageSize, 0, 0, record(PageSize-24))
	if got, ok := LastRecordEnd(p3, base+3*PageSize, seg); !ok || got != base+4*PageSize {
		t.Fatalf("record to the page end: %s %v", got, ok)
	}
	// Not WAL (zeros, wrong page address, misaligned): the write's end.
	zeros := make([]byte, PageSize)
	if got, ok := LastRecordEnd(zeros, base, seg); !ok || got != base+PageSize {
		t.Fatalf("zeros: %s %v", got, ok)
	}
	if got, ok := LastRecordEnd(p3, base, seg); !ok || got != base+PageSize {
		t.Fatalf("wrong pageaddr: %s %v", got, ok)
	}
	if got, ok := LastRecordEnd(p3[:100], base+8, seg); !ok || got != base+108 {
		t.Fatalf("misaligned: %s %v", got, ok)
	}
	// A short header where the long one belongs is not trusted.
	if got, ok := LastRecordEnd(page(base, 0, 0, record(50)), base, seg); !ok || got != base+PageSize {
		t.Fatalf("short header at a segment start: %s %v", got, ok)
	}
}

// FuzzLastRecordEnd checks that any input is handled without a panic and
// that the result stays inside the write; the seeds run in every go test.
func FuzzLastRecordEnd(f *testing.F) {
	seg := uint64(pg.WALSegmentSize)
	f.Add(page(pg.LSN(seg), xlpLongHeader, 0, record(50)), uint64(seg))
	f.Add(page(pg.LSN(seg)+PageSize, xlpFirstIsContRecord, 9000, nil), uint64(seg)+PageSize)
	f.Add(make([]byte, 100), uint64(8))
	f.Fuzz(func(t *testing.T, data []byte, start uint64) {
		start %= 1 << 40
		got, ok := LastRecordEnd(data, pg.LSN(start), seg)
		if !ok {
			if got != 0 {
				t.Fatalf("not ok with end %s", got)
			}
			return
		}
		if got <= pg.LSN(start) || got > pg.LSN(start)+pg.LSN(len(data)) {
			t.Fatalf("end %s outside the write %d+%d", got, start, len(data))
		}
	})
}

// TestLastRecordEndRandomPages writes random mutations of valid pages: the
// result is never past the write nor before its start.
func TestLastRecordEndRandomPages(t *testing.T) {
	seg := uint64(pg.WALSegmentSize)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 5000; i++ {
		at := pg.LSN(seg + uint64(rng.IntN(64))*PageSize)
		info := uint16(0)
		if uint64(at)%seg == 0 {
			info = xlpLongHeader
		}
		var body []byte
		for len(body) < PageSize {
			n := 24 + rng.IntN(400)
			body = append(body, record(n)...)
			body = append(body, make([]byte, int(maxAlign(uint64(n)))-n)...)
		}
		p := page(at, info, 0, body)
		for k := rng.IntN(4); k > 0; k-- {
			p[rng.IntN(PageSize)] = byte(rng.Uint32())
		}
		got, ok := LastRecordEnd(p, at, seg)
		if ok && (got <= at || got > at+PageSize) {
			t.Fatalf("end %s outside page %s", got, at)
		}
	}
}

// TestRecordEndAtOrBelowOnRealWAL cuts initdb's WAL at random LSNs (as a
// safekeeper's flush can cut a record) and checks that the end found is the
// highest record end at or below the cut, per pg_waldump.
func TestRecordEndAtOrBelowOnRealWAL(t *testing.T) {
	seg, segStart, recs := realWAL(t)
	ends := recordEnds(recs)
	floor, walEnd := ends[0], ends[len(ends)-1]
	reads := 0
	read := func(_ context.Context, from, to pg.LSN) ([]byte, error) {
		reads++
		if from < segStart || to > segStart+pg.LSN(len(seg)) || from > to {
			return nil, fmt.Errorf("read %s..%s outside the segment", from, to)
		}
		return seg[from-segStart : to-segStart], nil
	}
	rng := rand.New(rand.NewPCG(3, 4))
	cuts := []pg.LSN{floor, walEnd}
	for i := 0; i < 2000; i++ {
		cuts = append(cuts, floor+pg.LSN(rng.Uint64N(uint64(walEnd-floor)+1)))
	}
	for _, e := range ends[:min(len(ends), 300)] {
		cuts = append(cuts, e, e-1, e+1)
	}
	ctx := context.Background()
	for _, e := range cuts {
		if e < floor || e > walEnd+1 {
			continue
		}
		i := sort.Search(len(ends), func(i int) bool { return ends[i] > e }) - 1
		want := ends[i]
		got, err := RecordEndAtOrBelow(ctx, read, e, floor, pg.WALSegmentSize)
		if err != nil {
			t.Fatalf("cut at %s: %v", e, err)
		}
		if got != want {
			t.Fatalf("cut at %s: got %s, want %s", e, got, want)
		}
	}
	// A read that fails is an error, not a guess.
	if _, err := RecordEndAtOrBelow(ctx, func(context.Context, pg.LSN, pg.LSN) ([]byte, error) {
		return nil, errors.New("safekeeper gone")
	}, walEnd, floor, pg.WALSegmentSize); err == nil {
		t.Fatal("a failed read must be an error")
	}
	// Foreign bytes are an error too.
	junk := func(_ context.Context, from, to pg.LSN) ([]byte, error) {
		return bytes.Repeat([]byte{0xAB}, int(to-from)), nil
	}
	if _, err := RecordEndAtOrBelow(ctx, junk, walEnd, floor, pg.WALSegmentSize); err == nil {
		t.Fatal("a page that is not WAL must be an error")
	}
	t.Logf("%d cuts, %d page reads", len(cuts), reads)
}
