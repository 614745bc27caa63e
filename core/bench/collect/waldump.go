package collect

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/sdk/pg"
)

// WALStats is pg_waldump --stats' total line over a range of WAL.
type WALStats struct {
	Records               int64
	RecordBytes, FPIBytes int64
	TotalBytes            int64
}

// FPIShare is the share of WAL bytes that are full page images.
func (w WALStats) FPIShare() float64 {
	if w.TotalBytes == 0 {
		return 0
	}
	return float64(w.FPIBytes) / float64(w.TotalBytes)
}

// WALDump runs pg_waldump --stats over [start, end) in walDir and parses
// the totals. It needs the segments still present (runs shorter than
// checkpoint_timeout keep them).
func WALDump(ctx context.Context, binDir, walDir, start, end string) (WALStats, error) {
	args := []string{"--stats", "-p", walDir, "-s", start, "-e", end}
	// Named, the segment that holds start is where pg_waldump reads the
	// segment size. Unnamed, it reads it from the first WAL file its
	// directory listing gives, which can be one that Postgres made ahead of
	// need and is still zeros ("header specifies 0 bytes"). Given a first
	// segment it wants the last one too, or stops at the first's end.
	if first, last, ok := rangeSegments(walDir, start, end); ok {
		args = append(args, first, last)
	}
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "pg_waldump"), args...).CombinedOutput()
	if err != nil {
		return WALStats{}, fmt.Errorf("collect: pg_waldump %s: %w: %s", strings.Join(args, " "), err, errorLine(string(out)))
	}
	return ParseWALDumpStats(string(out))
}

// rangeSegments names the file in walDir that holds the WAL at start, on
// the highest timeline that has one, and the segment on that timeline that
// holds the last byte before end: the segment size comes from the long
// header of a WAL file that is not zeros.
func rangeSegments(walDir, start, end string) (first, last string, ok bool) {
	var tli pg.PGTimeline
	from, err1 := pg.ParseLSN(start)
	to, err2 := pg.ParseLSN(end)
	if err1 != nil || err2 != nil || to <= from {
		return "", "", false
	}
	ents, err := os.ReadDir(walDir)
	if err != nil {
		return "", "", false
	}
	var segSize uint64
	for _, e := range ents {
		if segSize = walSegSize(filepath.Join(walDir, e.Name())); segSize != 0 {
			break
		}
	}
	if segSize == 0 {
		return "", "", false
	}
	for _, e := range ents {
		n, err := walpos.ParseSegmentName(e.Name(), segSize)
		if err != nil || n.SegNo != from.Segment(segSize) || first != "" && n.Timeline < tli {
			continue
		}
		if walSegSize(filepath.Join(walDir, e.Name())) == segSize {
			first, tli = e.Name(), n.Timeline
		}
	}
	if first == "" {
		return "", "", false
	}
	return first, walpos.FormatSegmentName(tli, (to - 1).Segment(segSize), segSize), true
}

// walSegSize reads the segment size from the long page header that opens
// a WAL segment file (xlp_magic at 0, xlp_seg_size at 32), or 0 when the
// file does not open with one (zeros, not WAL, unreadable).
func walSegSize(path string) uint64 {
	f, err := os.Open(path)
	if err != nil {
		return 0
	}
	defer f.Close()
	var h [40]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return 0
	}
	const longHeader = 0x0002 // XLP_LONG_HEADER in xlp_info
	magic, info := binary.LittleEndian.Uint16(h[0:]), binary.LittleEndian.Uint16(h[2:])
	size := uint64(binary.LittleEndian.Uint32(h[32:]))
	if magic == 0 || info&longHeader == 0 || size < 1<<20 || size > 1<<30 || size&(size-1) != 0 {
		return 0
	}
	return size
}

// ParseWALDumpStats reads the "Total" line of pg_waldump --stats output:
// Total N RecordSize [pct] FPISize [pct] CombinedSize [100%].
func ParseWALDumpStats(out string) (WALStats, error) {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Total" {
			continue
		}
		var nums []int64
		for _, x := range f[1:] {
			if strings.HasPrefix(x, "[") || strings.HasPrefix(x, "(") {
				continue
			}
			v, err := strconv.ParseInt(x, 10, 64)
			if err != nil {
				continue
			}
			nums = append(nums, v)
		}
		if len(nums) != 4 {
			return WALStats{}, fmt.Errorf("collect: pg_waldump total line %q", line)
		}
		return WALStats{Records: nums[0], RecordBytes: nums[1], FPIBytes: nums[2], TotalBytes: nums[3]}, nil
	}
	return WALStats{}, fmt.Errorf("collect: no Total line in pg_waldump output: %s", lastLine(out))
}

// errorLine is pg_waldump's "error:" line (its last line is a hint), or
// its last line.
func errorLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, "error: ") {
			return strings.TrimSpace(l)
		}
	}
	return lastLine(s)
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
