package postgres

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// DumpOptions select what Dump prints.
type DumpOptions struct {
	Start pg.LSN // first record at or after Start
	End   pg.LSN // stop before records that end after End; 0 means the end of the WAL
	// Rmgrs, when not empty, keeps only records of these resource managers.
	Rmgrs []wal.RmgrID
	// Stats prints statistics instead of records; PerRecord splits them by
	// record type (pg_waldump --stats=record).
	Stats     bool
	PerRecord bool
	// Limit stops after this many records (0: no limit).
	Limit int
}

// StatRow holds the counts of one resource manager or record type.
type StatRow struct {
	Count  uint64
	RecLen uint64 // record bytes without full page images
	FPILen uint64 // full page image bytes
}

// Stats are the per-rmgr and per-record-type counts pg_waldump --stats
// prints.
type Stats struct {
	Start, End pg.LSN // first record's start, last record's end
	Count      uint64
	Rmgr       [256]StatRow
	Record     [256][16]StatRow
}

// Add counts one record the way pg_waldump does.
func (s *Stats) Add(r *wal.Record) {
	if s.Count == 0 {
		s.Start = r.LSN
	}
	s.End = r.EndLSN
	s.Count++
	fpi := uint64(r.FPILen())
	rec := uint64(r.TotLen) - fpi
	row := &s.Rmgr[r.RmID]
	row.Count++
	row.RecLen += rec
	row.FPILen += fpi
	id := r.Info >> 4
	if r.RmID == wal.RmXact {
		id &= 0x07
	}
	row = &s.Record[r.RmID][id]
	row.Count++
	row.RecLen += rec
	row.FPILen += fpi
}

// FPIShare returns the fraction of WAL record bytes that are full page images.
func (s *Stats) FPIShare() float64 {
	var rec, fpi uint64
	for _, r := range s.Rmgr {
		rec += r.RecLen
		fpi += r.FPILen
	}
	if rec+fpi == 0 {
		return 0
	}
	return float64(fpi) / float64(rec+fpi)
}

// Write prints the statistics in pg_waldump's --stats layout.
func (s *Stats) Write(w io.Writer, perRecord bool) error {
	var tc, tr, tf uint64
	for i := 0; i <= int(wal.RmMax); i++ {
		tc += s.Rmgr[i].Count
		tr += s.Rmgr[i].RecLen
		tf += s.Rmgr[i].FPILen
	}
	tl := tr + tf
	pct := func(a, b uint64) float64 {
		if b == 0 {
			return 0
		}
		return 100 * float64(a) / float64(b)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "WAL statistics between %s and %s:\n", s.Start, s.End)
	fmt.Fprintf(&b, "%-27s %20s %8s %20s %8s %20s %8s %20s %8s\n", "Type", "N", "(%)", "Record size", "(%)", "FPI size", "(%)", "Combined size", "(%)")
	fmt.Fprintf(&b, "%-27s %20s %8s %20s %8s %20s %8s %20s %8s\n", "----", "-", "---", "-----------", "---", "--------", "---", "-------------", "---")
	row := func(name string, r StatRow) {
		t := r.RecLen + r.FPILen
		fmt.Fprintf(&b, "%-27s %20d (%6.02f) %20d (%6.02f) %20d (%6.02f) %20d (%6.02f)\n",
			name, r.Count, pct(r.Count, tc), r.RecLen, pct(r.RecLen, tr), r.FPILen, pct(r.FPILen, tf), t, pct(t, tl))
	}
	for i := 0; i <= int(wal.RmMax); i++ {
		rm := wal.RmgrID(i)
		if !perRecord {
			row(rm.String(), s.Rmgr[i])
			continue
		}
		for j := 0; j < 16; j++ {
			r := s.Record[i][j]
			if r.Count == 0 {
				continue
			}
			id, ok := wal.Identify(rm, uint8(j<<4))
			if !ok {
				id = fmt.Sprintf("UNKNOWN (%x)", j<<4)
			}
			row(rm.String()+"/"+id, r)
		}
	}
	fmt.Fprintf(&b, "%-27s %20s %8s %20s %8s %20s %8s %20s\n", "", "--------", "", "--------", "", "--------", "", "--------")
	fmt.Fprintf(&b, "%-27s %20d %-9s%20d %-9s%20d %-9s%20d %-6s\n", "Total", s.Count, "",
		tr, fmt.Sprintf("[%.02f%%]", pct(tr, tl)), tf, fmt.Sprintf("[%.02f%%]", pct(tf, tl)), tl, "[100%]")
	_, err := io.WriteString(w, b.String())
	return err
}

// CollectStats reads records from src between opts.Start and opts.End
// (filtered by opts.Rmgrs) and counts them. Reaching the end of the
// available WAL is not an error; a corrupt record is, and the statistics
// gathered so far are returned with it.
func CollectStats(src wal.Source, opts DumpOptions) (*Stats, error) {
	s := &Stats{}
	err := walk(src, opts, func(r *wal.Record) error { s.Add(r); return nil })
	return s, err
}

// Dump prints records (or statistics, with opts.Stats) from src to w, in
// pg_waldump's format.
func Dump(w io.Writer, src wal.Source, opts DumpOptions) error {
	if opts.Stats {
		s, err := CollectStats(src, opts)
		if werr := s.Write(w, opts.PerRecord); werr != nil {
			return werr
		}
		return err
	}
	var b strings.Builder
	return walk(src, opts, func(r *wal.Record) error {
		b.Reset()
		FormatRecord(&b, r)
		b.WriteByte('\n')
		_, err := io.WriteString(w, b.String())
		return err
	})
}

func walk(src wal.Source, opts DumpOptions, fn func(*wal.Record) error) error {
	rd := wal.NewReader(src, opts.Start)
	n := 0
	for {
		r, err := rd.Next()
		if err != nil {
			if errors.Is(err, wal.ErrEndOfWAL) {
				return nil
			}
			if opts.End != 0 && rd.NextLSN() >= opts.End {
				return nil
			}
			return err
		}
		if opts.End != 0 && r.EndLSN > opts.End {
			return nil
		}
		if len(opts.Rmgrs) > 0 && !containsRmgr(opts.Rmgrs, r.RmID) {
			continue
		}
		if err := fn(r); err != nil {
			return err
		}
		n++
		if opts.Limit > 0 && n >= opts.Limit {
			return nil
		}
	}
}

func containsRmgr(l []wal.RmgrID, id wal.RmgrID) bool {
	for _, x := range l {
		if x == id {
			return true
		}
	}
	return false
}

// FormatRecord writes one pg_waldump-style line (without the newline).
func FormatRecord(b *strings.Builder, r *wal.Record) {
	fpi := r.FPILen()
	fmt.Fprintf(b, "rmgr: %-11s len (rec/tot): %6d/%6d, tx: %10d, lsn: %X/%08X, prev %X/%08X, ",
		r.RmID, int(r.TotLen)-fpi, r.TotLen, r.XID, uint32(r.LSN>>32), uint32(r.LSN), uint32(r.Prev>>32), uint32(r.Prev))
	id, ok := wal.Identify(r.RmID, r.Info)
	if !ok {
		fmt.Fprintf(b, "desc: UNKNOWN (%x) ", r.RmInfo())
	} else {
		fmt.Fprintf(b, "desc: %s ", id)
	}
	b.WriteString(Describe(r))
	for i := range r.Blocks {
		blk := &r.Blocks[i]
		if blk.Page.Fork != pg.MainFork {
			fmt.Fprintf(b, ", blkref #%d: rel %d/%d/%d fork %s blk %d", blk.ID, blk.Page.Spc, blk.Page.DB, blk.Page.Rel, blk.Page.Fork, blk.Page.Block)
		} else {
			fmt.Fprintf(b, ", blkref #%d: rel %d/%d/%d blk %d", blk.ID, blk.Page.Spc, blk.Page.DB, blk.Page.Rel, blk.Page.Block)
		}
		if blk.HasImage {
			if blk.ApplyImage {
				b.WriteString(" FPW")
			} else {
				b.WriteString(" FPW for WAL verification")
			}
		}
	}
}
