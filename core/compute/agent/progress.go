package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/internal/procfs"
	"github.com/stratadb/strata/sdk/pg"
)

// A start of Postgres from storage can be long: the WAL since the last
// checkpoint is fetched from the safekeepers, then Postgres' crash
// recovery replays it, reading every page it touches through the mount.
// Both grow with max_wal_size and checkpoint_timeout. So can a stop: the
// shutdown checkpoint writes every dirty page of shared_buffers through
// the mount. No fixed bound fits every cluster, so the agent bounds each
// by the time it goes without progress (Config.StartTimeout,
// Config.StopTimeout) and reports how far it got (Report.Progress), which
// `strata up`, `strata down`, `strata status` and `strata compute waits`
// show.

// ErrNoProgress: a start or a stop of Postgres made no progress for its
// bound.
var ErrNoProgress = errors.New("agent: no progress")

// Progress is how far the start or the stop of Postgres under way got.
type Progress struct {
	// Step is the agent's state: electing, loading, fetching WAL,
	// mounting, initdb, recovering, waiting for the safekeepers (a start);
	// stopping (a stop).
	Step string `json:"step"`
	// FetchedSegments of FetchSegments WAL segments are in pg_wal
	// (fetching WAL).
	FetchedSegments int `json:"fetched_segments,omitempty"`
	FetchSegments   int `json:"fetch_segments,omitempty"`
	// Replaying is the WAL segment Postgres' startup process reads, from
	// its process title (recovering; empty until it opens one, or with
	// update_process_title off). ReplayAt is where that segment starts;
	// recovery replays from ReplayFrom (the checkpoint's redo point) to
	// ReplayEnd (the end of the durable WAL).
	Replaying  string `json:"replaying,omitempty"`
	ReplayFrom pg.LSN `json:"replay_from,omitempty"`
	ReplayAt   pg.LSN `json:"replay_at,omitempty"`
	ReplayEnd  pg.LSN `json:"replay_end,omitempty"`
	// MountOps is how many reads and writes the mount served in this
	// start (since it was mounted) or stop (crash recovery reading pages,
	// a checkpoint writing them out, move it).
	MountOps uint64 `json:"mount_ops,omitempty"`
	// ImportBytes is the size of the folder an import copies into the
	// mount; MountWritten the bytes written on the mount so far (the
	// copy's, while importing).
	ImportBytes  int64  `json:"import_bytes,omitempty"`
	MountWritten uint64 `json:"mount_written,omitempty"`
	// Elapsed is how long the start or stop has run; Idle how long since
	// it last moved (a new step, a segment fetched, a segment replayed, a
	// read or write on the mount).
	Elapsed string `json:"elapsed"`
	Idle    string `json:"idle"`
}

// Percent is the share of the WAL to replay that lies below the segment
// being replayed (0 when unknown).
func (p *Progress) Percent() float64 {
	if p.ReplayEnd <= p.ReplayFrom || p.ReplayAt <= p.ReplayFrom {
		return 0
	}
	return 100 * float64(min(p.ReplayAt, p.ReplayEnd)-p.ReplayFrom) / float64(p.ReplayEnd-p.ReplayFrom)
}

// Verb says whether Postgres is starting or stopping.
func (p *Progress) Verb() string {
	if p.Step == "stopping" {
		return "stopping"
	}
	return "starting"
}

// String is one line for a person: the step and, while WAL is fetched or
// replayed or pages are written, how far.
func (p *Progress) String() string {
	var notes []string
	if p.Step == "recovering" && p.Replaying != "" && p.ReplayEnd > p.ReplayFrom {
		notes = append(notes, fmt.Sprintf("%s, %.0f%% of %s..%s", p.ReplayAt, p.Percent(), p.ReplayFrom, p.ReplayEnd))
	}
	if p.MountOps > 0 {
		notes = append(notes, fmt.Sprintf("%d reads and writes on the mount", p.MountOps))
	}
	line := p.Step
	switch {
	case strings.HasPrefix(p.Step, "importing ") && p.ImportBytes > 0:
		return fmt.Sprintf("%s: %s of %s copied (%.0f%%)", p.Step, mib(int64(p.MountWritten)), mib(p.ImportBytes),
			100*min(1, float64(p.MountWritten)/float64(p.ImportBytes)))
	case p.Step == "fetching WAL" && p.FetchSegments > 0:
		return fmt.Sprintf("fetching WAL from the safekeepers: %d of %d segments", p.FetchedSegments, p.FetchSegments)
	case p.Step == "recovering" && p.Replaying != "":
		line = "postgres replaying WAL: segment " + p.Replaying
	case p.Step == "recovering":
		line = "postgres starting"
	case p.Step == "stopping":
		line = "postgres shutting down"
	case p.Step != "initdb":
		return line
	}
	if len(notes) > 0 {
		line += " (" + strings.Join(notes, "; ") + ")"
	}
	return line
}

// progressTracker holds the progress of the current start or stop.
type progressTracker struct {
	mu     sync.Mutex
	p      Progress
	active bool
	began  time.Time
	moved  time.Time
}

// begin starts tracking a new start or stop.
func (t *progressTracker) begin() {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	t.p, t.active, t.began, t.moved = Progress{}, true, now, now
}

// end stops tracking: the start or stop finished or failed.
func (t *progressTracker) end() {
	t.mu.Lock()
	t.active = false
	t.mu.Unlock()
}

// update applies fn to the progress; a change counts as progress.
func (t *progressTracker) update(fn func(*Progress)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.active {
		return
	}
	before := t.p
	fn(&t.p)
	if t.p != before {
		t.moved = time.Now()
	}
}

// idle is how long the start or stop has gone without progress (0 when
// none runs).
func (t *progressTracker) idle() time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.active {
		return 0
	}
	return time.Since(t.moved)
}

// report is the progress now (nil when no start or stop runs).
func (t *progressTracker) report() *Progress {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.active {
		return nil
	}
	p := t.p
	p.Elapsed = time.Since(t.began).Round(time.Second).String()
	p.Idle = time.Since(t.moved).Round(time.Second).String()
	return &p
}

// watchProgress runs beside one start or stop until ctx ends: five times
// a second it reads which segment crash recovery replays and how many
// reads and writes the mount served; it logs the progress every 10 s
// while WAL is fetched or replayed or Postgres shuts down; and it cancels
// (stop, with ErrNoProgress) once bound has passed without progress.
func (a *Agent) watchProgress(ctx context.Context, stop context.CancelCauseFunc, bound time.Duration) {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	lastLog := time.Now()
	// Count from here on a mount that exists already (a stop), from its
	// start on one mounted later (a start).
	var base, baseWritten uint64
	mount := a.currentFS()
	if mount != nil {
		base, baseWritten = mount.Waits().Ops(), mount.Waits().WrittenBytes()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		a.readReplay()
		if f := a.currentFS(); f != nil {
			if f != mount {
				mount, base, baseWritten = f, 0, 0
			}
			ops, written := f.Waits().Ops()-base, f.Waits().WrittenBytes()-baseWritten
			a.sp.update(func(p *Progress) { p.MountOps, p.MountWritten = ops, written })
		}
		p := a.sp.report()
		if p == nil {
			continue
		}
		if idle := a.sp.idle(); idle >= bound {
			stop(fmt.Errorf("%w for %s while %s", ErrNoProgress, bound, p))
			return
		}
		switch p.Step {
		case "fetching WAL", "recovering", "stopping":
			if time.Since(lastLog) >= 10*time.Second {
				lastLog = time.Now()
				a.log.Info().Str("progress", p.String()).Str("elapsed", p.Elapsed).Msg(p.Step)
			}
		}
	}
}

// readReplay records the segment that Postgres' startup process replays,
// while the start is in crash recovery.
func (a *Agent) readReplay() {
	if p := a.sp.report(); p == nil || p.Step != "recovering" {
		return
	}
	pm := a.PostmasterPID()
	if pm <= 0 {
		return
	}
	name, ok := ReplayingSegment(pm, clusterTag(a.cfg.Mountpoint))
	if !ok {
		return
	}
	s, err := walpos.ParseSegmentName(name, pg.WALSegmentSize)
	if err != nil {
		return
	}
	a.sp.update(func(p *Progress) {
		p.Replaying, p.ReplayAt = name, pg.LSN(s.SegNo*pg.WALSegmentSize)
	})
}

// ReplayingSegment finds the startup process of the postmaster pm (tagged
// tag: its cluster_name) and returns the WAL segment its title says it
// recovers from ("postgres: <tag>: startup recovering <segment>").
func ReplayingSegment(pm int, tag string) (string, bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return "", false
	}
	prefix := []byte("postgres: " + tag + ": startup ")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == pm {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.HasPrefix(cmdline, prefix) {
			continue
		}
		if st, err := procfs.ReadStat(pid); err != nil || st.PPID != pm {
			continue
		}
		activity, _, _ := bytes.Cut(cmdline[len(prefix):], []byte{0})
		return segmentInTitle(string(activity))
	}
	return "", false
}

// segmentInTitle parses the activity part of a startup process title,
// "recovering 000000010000000000000003" (maybe followed by " waiting").
func segmentInTitle(activity string) (string, bool) {
	f := strings.Fields(activity)
	if len(f) < 2 || f[0] != "recovering" {
		return "", false
	}
	if _, err := walpos.ParseSegmentName(f[1], pg.WALSegmentSize); err != nil {
		return "", false
	}
	return f[1], true
}
