package collect

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
	out, err := exec.CommandContext(ctx, filepath.Join(binDir, "pg_waldump"), "--stats", "-p", walDir, "-s", start, "-e", end).CombinedOutput()
	if err != nil {
		return WALStats{}, fmt.Errorf("collect: pg_waldump: %w: %s", err, lastLine(string(out)))
	}
	return ParseWALDumpStats(string(out))
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

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
