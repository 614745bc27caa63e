package collect

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// scrape reads a Prometheus text exposition and returns every sample by
// its series name (name plus labels as written).
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("collect: metrics %s: %w", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("collect: metrics %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("collect: metrics %s: %s", url, resp.Status)
	}
	return ParseMetrics(bufio.NewScanner(resp.Body))
}

// ParseMetrics parses Prometheus text format lines: "name{labels} value
// [timestamp]"; comments are skipped.
func ParseMetrics(sc *bufio.Scanner) (map[string]float64, error) {
	out := map[string]float64{}
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		// The series ends at the closing brace, or at the first space.
		var series, rest string
		if i := strings.IndexByte(line, '{'); i >= 0 && i < strings.IndexByte(line+" ", ' ') {
			j := strings.LastIndexByte(line, '}')
			if j < i {
				continue
			}
			series, rest = line[:j+1], line[j+1:]
		} else {
			sp := strings.IndexByte(line, ' ')
			if sp < 0 {
				continue
			}
			series, rest = line[:sp], line[sp:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		out[series] = v
	}
	return out, sc.Err()
}
