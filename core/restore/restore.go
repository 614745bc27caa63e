// Package restore makes a stock PostgreSQL 15 data directory that holds a
// strata cluster's database as it was at an earlier moment: a
// point-in-time restore into a folder of its own, read from the
// pageserver's page history and from the WAL that the safekeepers (or
// the archive in the object store) hold. The cluster keeps running and
// is not changed.
//
// How (DESIGN.md 3a, a point-in-time start at LSN X):
//
//   - Every file and every relation page is read at X: in writeback mode
//     the newest version tagged W <= X, in redo mode the pages rebuilt
//     from WAL at X. Taken together they are the data directory as a
//     crash at the moment the compute's WAL flush passed X would have
//     left it, so it is consistent once recovery has replayed every
//     record that starts before X.
//   - The pg_control among them names a checkpoint C whose record ends
//     at or below X (Postgres writes pg_control after flushing C). pg_wal
//     gets the WAL from C's REDO point up to the first record at or after
//     X.
//   - Postgres runs archive recovery from C, stops before the first record
//     at or after X (recovery_target_lsn, not inclusive), promotes to a
//     new timeline and is shut down cleanly. pg_control's minimum
//     recovery point is set to the end of the last record before X, so
//     Postgres itself refuses to stop earlier.
//
// A target time is turned into an LSN first: X is the first commit or
// abort record stamped after that time, which is where Postgres'
// recovery_target_time would stop.
package restore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/core/postgres"
	"github.com/stratadb/strata/sdk/pg"
)

// ControlFile is pg_control's path in a data directory.
const ControlFile = "global/pg_control"

// Target is the moment to restore to: an LSN (everything that starts
// before it), or a time (every transaction that committed at or before
// it). Exactly one is set.
type Target struct {
	LSN  pg.LSN
	Time time.Time
	// Latest: the newest durable WAL.
	Latest bool
}

// String prints the target as the user gave it.
func (t Target) String() string {
	if t.Latest {
		return "latest"
	}
	if !t.Time.IsZero() {
		return t.Time.Format("2006-01-02 15:04:05.999999 -07:00")
	}
	return t.LSN.String()
}

// Time layouts ParseTarget accepts, besides RFC 3339.
// (A fraction of a second may follow the seconds in each.)
var timeLayouts = []string{
	"2006-01-02 15:04:05Z07:00",
	"2006-01-02 15:04:05 Z07:00",
	"2006-01-02 15:04:05Z0700",
	"2006-01-02 15:04:05 Z0700",
	"2006-01-02 15:04:05Z07", // as Postgres prints it: +00
	"2006-01-02 15:04:05 MST",
	"2006-01-02 15:04:05",
	"2006-01-02T15:04:05",
	"2006-01-02 15:04",
}

// ParseTarget reads an LSN ("16/B374D848") or a time ("2026-12-06
// 13:40:00", in the local zone unless one is given; RFC 3339 too).
func ParseTarget(s string) (Target, error) {
	s = strings.TrimSpace(s)
	if s == "latest" {
		return Target{Latest: true}, nil
	}
	if strings.Contains(s, "/") && !strings.ContainsAny(s, " -:") {
		l, err := pg.ParseLSN(s)
		if err != nil {
			return Target{}, fmt.Errorf("restore: target %q: %w", s, err)
		}
		if l == 0 {
			return Target{}, fmt.Errorf("restore: target %q: LSN 0/0 is before any WAL", s)
		}
		return Target{LSN: l}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return Target{Time: t}, nil
	}
	for _, layout := range timeLayouts {
		if t, err := time.ParseInLocation(layout, s, time.Local); err == nil {
			return Target{Time: t}, nil
		}
	}
	return Target{}, fmt.Errorf("restore: target %q is neither an LSN (like 0/16B3748), a time (like \"2026-12-06 13:40:00\" or 2026-12-06T13:40:00Z) nor latest", s)
}

// Options say what to restore, from where, and into which folder.
type Options struct {
	// Pageserver serves the cluster's timelines.
	Pageserver *client.Client
	// Timeline holds the relation pages (the redo timeline in redo mode);
	// FilesTimeline the other files (zero: Timeline).
	Timeline, FilesTimeline pg.TimelineID
	// Redo: the pages are rebuilt from WAL (storage.page_source redo):
	// FSM forks are left out (Postgres does not WAL-log them all, and
	// rebuilds them), and page reads wait for WAL ingest to reach X.
	Redo bool
	// WAL is where the WAL comes from: the safekeepers, then the archive.
	WAL agent.WALSource
	// Postgres gives the PostgreSQL programs and the OS user (BinDir,
	// OSUser); the rest is set here.
	Postgres postgres.Server
	// Dir is the new data directory: it must not exist or be empty.
	Dir string
	// Port is the restored server's port (on 127.0.0.1), used for the
	// recovery run and written into its configuration.
	Port int
	At   Target
	// End, when set, is the newest LSN to restore to instead of the
	// timelines' commit LSN (a pageserver opened on the object store alone
	// follows no safekeepers: the end is what the archive and the store's
	// manifests hold).
	End pg.LSN
	// PagesEnd, when set, is the newest LSN the pages can be read at (a
	// pageserver opened on the object store alone holds them only as far
	// as its uploads reached): a target past it is restored from the
	// pages at PagesEnd and the WAL from there on, which Postgres
	// replays, as it would from a base backup.
	PagesEnd pg.LSN
	// Progress gets a line now and then (nil: none).
	Progress func(string)
	Log      zerolog.Logger
	// Stopped, when set, says why a pageserver that stopped answering
	// will not come back (its cluster was stopped), or nil: a restore
	// waits for it only while Stopped is nil.
	Stopped func() error

	// down asks the pageserver again while it does not answer (Run sets it).
	down *outages
}

// Result says what was restored.
type Result struct {
	// LSN: the copy holds every record that starts before it.
	LSN pg.LSN
	// PagesAt: the pages were read at this LSN (LSN, or below it when
	// Options.PagesEnd held them back; Postgres replayed the WAL between).
	PagesAt pg.LSN
	// Checkpoint and Redo: where recovery started.
	Checkpoint, Redo pg.LSN
	// Consistent: the end of the last record before LSN (pg_control's
	// minimum recovery point).
	Consistent pg.LSN
	// EndOfWAL: no record starts at or after LSN yet; recovery replayed
	// all the WAL there is.
	EndOfWAL bool
	// Files, Relations, Pages and Segments count what was written.
	Files, Relations int
	Pages            int64
	Segments         int
	// Stop and LastCommit are Postgres' own lines about where recovery
	// stopped ("recovery stopping before commit of transaction 745, time
	// ...") and the last transaction it replayed ("2026-12-06
	// 13:40:02.116+00"); empty when it did not log them.
	Stop, LastCommit string
	// LogFile is the server log of the recovery run.
	LogFile string
	Took    time.Duration
}

// Errors callers may test for.
var (
	// ErrTooOld: the target is older than the history the pageserver keeps.
	ErrTooOld = errors.New("restore: too old")
	// ErrTooNew: the target is past the newest durable WAL.
	ErrTooNew = errors.New("restore: too new")
	// ErrDirNotEmpty: the destination folder holds files.
	ErrDirNotEmpty = errors.New("restore: destination folder is not empty")
)

// Run restores o.At into o.Dir and returns what it did. On failure the
// folder is removed again (it was empty), and the error carries the tail
// of Postgres' log when recovery failed.
func Run(ctx context.Context, o Options) (res *Result, err error) {
	t0 := time.Now()
	if o.Progress == nil {
		o.Progress = func(string) {}
	}
	o.down = &outages{limit: pageserverOutage, say: o.Progress, stopped: o.Stopped}
	if o.FilesTimeline == (pg.TimelineID{}) {
		o.FilesTimeline = o.Timeline
	}
	if o.WAL.SegmentSize == 0 {
		o.WAL.SegmentSize = pg.WALSegmentSize
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return nil, err
	}
	o.Dir = dir
	if err := checkEmpty(dir); err != nil {
		return nil, err
	}
	// The history from the oldest LSN on is held while the target is
	// looked for, then from the target on while it is read.
	oldest, end, hold, err := holdOldest(ctx, o)
	if err != nil {
		return nil, err
	}
	defer hold.release()
	first, err := firstControl(ctx, o, oldest, end)
	if err != nil {
		return nil, err
	}
	oldest = max(oldest, first)
	x := o.At.LSN
	if o.At.Latest {
		x = end
	}
	if !o.At.Time.IsZero() {
		o.Progress(fmt.Sprintf("finding the WAL position of %s", o.At))
		if x, err = lsnForTime(ctx, o, oldest, end); err != nil {
			return nil, err
		}
		o.Progress(fmt.Sprintf("%s is WAL position %s", o.At, x))
	}
	if x > end && x-end <= endWaitBytes && o.End == 0 {
		// A position just written (pg_current_wal_lsn() a moment ago)
		// reaches the pageserver's commit LSN within moments.
		if end, err = waitEnd(ctx, o, x); err != nil {
			return nil, err
		}
	}
	switch {
	case x < oldest:
		return nil, fmt.Errorf("%w: %s is older than the page history the pageserver keeps for this cluster, which starts at %s (storage.pitr and storage.gc_horizon say how far back it reaches)", ErrTooOld, x, oldest)
	case x > end:
		return nil, fmt.Errorf("%w: %s is past the newest durable WAL, %s", ErrTooNew, x, end)
	}
	// The pages are read at base, and Postgres replays the WAL from the
	// checkpoint pg_control names there up to x.
	base := x
	if o.PagesEnd > 0 {
		base = min(x, o.PagesEnd)
	}
	if err := hold.move(ctx, base); err != nil {
		return nil, err
	}
	ctlBytes, err := o.control(ctx, base)
	if err != nil {
		return nil, fmt.Errorf("restore: %s at %s: %w", ControlFile, base, err)
	}
	ctl, err := agent.ParseControl(ctlBytes)
	if err != nil {
		return nil, err
	}
	if ctl.Checkpoint >= base {
		return nil, fmt.Errorf("restore: %s at %s names checkpoint %s, not below it", ControlFile, base, ctl.Checkpoint)
	}

	cred, err := o.Postgres.Credential()
	if err != nil {
		return nil, err
	}
	uid, gid := os.Getuid(), os.Getgid()
	if cred != nil {
		uid, gid = int(cred.Uid), int(cred.Gid)
	}
	made := false
	defer func() {
		if err != nil && made {
			if rerr := os.RemoveAll(dir); rerr != nil {
				o.Log.Warn().Err(rerr).Str("dir", dir).Msg("removing the unfinished restore")
			}
			if ctx.Err() != nil {
				err = fmt.Errorf("restore: interrupted; %s is removed again (%w)", dir, err)
			}
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	made = true
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	srv := o.Postgres
	srv.DataDir, srv.Port, srv.SocketDir = dir, o.Port, dir
	srv.LogPath = filepath.Join(dir, "restore.log")
	if err := srv.CheckReachable(); err != nil {
		return nil, err
	}
	res = &Result{LSN: x, PagesAt: base, Checkpoint: ctl.Checkpoint, Redo: ctl.Redo, LogFile: srv.LogPath}

	if base < x {
		o.Progress(fmt.Sprintf("the pages reach %s: WAL from %s (checkpoint %s) past %s, replayed over them", base, ctl.Redo, ctl.Checkpoint, x))
	} else {
		o.Progress(fmt.Sprintf("WAL from %s (checkpoint %s) past %s", ctl.Redo, ctl.Checkpoint, x))
	}
	o.WAL.SystemID = ctl.SystemID
	w, err := fetchWAL(ctx, o.WAL, filepath.Join(dir, "pg_wal"), ctl.Timeline, ctl.Redo, x, end, uid, gid, o.Progress)
	if err != nil {
		return nil, err
	}
	res.Consistent, res.EndOfWAL, res.Segments = w.consistent, !w.next, w.segments

	b, err := writeBase(ctx, o, base, o.Progress)
	if errors.Is(err, timeline.ErrBelowGCCutoff) {
		return nil, fmt.Errorf("%w: the pageserver's GC passed %s while the restore ran, though the restore held a lease on it (was the pageserver restarted meanwhile, and the restore cut off from it for over a minute? it keeps leases in memory): choose a later moment, or try again (%w)", ErrTooOld, base, err)
	}
	if err != nil {
		return nil, err
	}
	res.Files, res.Relations, res.Pages = b.files, b.rels, b.pages
	ctlBytes, err = pageserver.ControlWithMinRecoveryPoint(ctlBytes, w.consistent, ctl.Timeline)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, ControlFile), ctlBytes, 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "recovery.signal"), nil, 0o600); err != nil {
		return nil, err
	}
	if err := chownTree(dir, uid, gid); err != nil {
		return nil, err
	}
	// strata's settings for the compute (synchronous replication to the
	// safekeepers, the memory budget) give way to a standalone server's.
	if err := srv.Configure(map[string]string{"cluster_name": "'" + clusterName + "'"}); err != nil {
		return nil, err
	}

	if err := runRecovery(ctx, &srv, x, res, o); err != nil {
		return nil, err
	}
	res.Took = time.Since(t0)
	return res, nil
}

// clusterName tags the restored server's processes ("postgres:
// strata-restore: startup recovering ...").
const clusterName = "strata-restore"

// checkEmpty fails when dir exists and holds anything.
func checkEmpty(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("%w: %s holds %d entries (give a new folder, or empty this one)", ErrDirNotEmpty, dir, len(ents))
	}
	return nil
}

// history returns the oldest LSN the pageserver can read the timelines at
// and the newest durable one (the safekeepers' commit LSN as the
// pageserver follows it).
func history(ctx context.Context, o Options) (oldest, end pg.LSN, err error) {
	tls, err := o.Pageserver.ListTimelines(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("restore: pageserver: %w", err)
	}
	found := 0
	for _, id := range []pg.TimelineID{o.Timeline, o.FilesTimeline} {
		for _, t := range tls {
			if t.ID != id {
				continue
			}
			found++
			oldest = max(oldest, t.LSNs.GCCutoff)
			if end == 0 || t.LSNs.Commit < end {
				end = t.LSNs.Commit
			}
		}
	}
	if found < 2 {
		return 0, 0, fmt.Errorf("restore: the pageserver has no timeline %s", o.Timeline)
	}
	if o.End > 0 {
		end = o.End
	}
	if end == 0 {
		return 0, 0, errors.New("restore: the pageserver knows no durable WAL of this cluster yet")
	}
	// The first WAL record of a cluster follows the first segment's long
	// page header: nothing can be restored below it.
	oldest = max(oldest, pg.LSN(40))
	return oldest, end, nil
}

// endWait is how long a restore waits for the newest durable WAL to
// reach its target before it says the target is too new.
const endWait = 10 * time.Second

// endWaitBytes: a target further past the newest durable WAL than this
// is refused at once.
const endWaitBytes = 64 << 20

// waitEnd waits up to endWait until the newest durable WAL that history
// reports reaches x, and returns it (below x when it did not).
func waitEnd(ctx context.Context, o Options, x pg.LSN) (pg.LSN, error) {
	deadline := time.Now().Add(endWait)
	for {
		_, end, err := history(ctx, o)
		if err != nil || end >= x || time.Now().After(deadline) {
			return end, err
		}
		select {
		case <-ctx.Done():
			return end, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// holdOldest returns history's LSNs with a lease on the oldest. GC may
// pass it between the two calls: then history is read again.
func holdOldest(ctx context.Context, o Options) (oldest, end pg.LSN, l *lease, err error) {
	for try := 1; ; try++ {
		if oldest, end, err = history(ctx, o); err != nil {
			return 0, 0, nil, err
		}
		l, err = holdHistory(ctx, o, oldest)
		if err == nil || !errors.Is(err, ErrTooOld) || try == 3 {
			return oldest, end, l, err
		}
	}
}

// Oldest returns the oldest moment a restore can reach on the running
// cluster: the LSN (the later of the pageserver's GC cutoff and the first
// stored pg_control) and the earliest time target it accepts (a second
// after the start of the checkpoint that pg_control names).
func Oldest(ctx context.Context, ps *client.Client, tl, filesTL pg.TimelineID) (pg.LSN, time.Time, error) {
	o := Options{Pageserver: ps, Timeline: tl, FilesTimeline: filesTL}
	if o.FilesTimeline == (pg.TimelineID{}) {
		o.FilesTimeline = tl
	}
	// GC may move its cutoff past the one history read before the reads
	// of pg_control at it (a short storage.pitr under writes moves it
	// every few seconds): then the history is read again.
	for tries := 1; ; tries++ {
		lsn, at, err := oldestOnce(ctx, o)
		if err == nil || !errors.Is(err, timeline.ErrBelowGCCutoff) || tries == oldestTries {
			return lsn, at, err
		}
	}
}

// oldestTries bounds Oldest's reads of a history that GC keeps moving.
const oldestTries = 5

func oldestOnce(ctx context.Context, o Options) (pg.LSN, time.Time, error) {
	oldest, end, err := history(ctx, o)
	if err != nil {
		return 0, time.Time{}, err
	}
	first, err := firstControl(ctx, o, oldest, end)
	if err != nil {
		return 0, time.Time{}, err
	}
	oldest = max(oldest, first)
	ctl, err := o.control(ctx, oldest)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("restore: %s at %s: %w", ControlFile, oldest, err)
	}
	at, err := pageserver.ControlCheckpointTime(ctl)
	if err != nil {
		return 0, time.Time{}, err
	}
	return oldest, at.Add(time.Second), nil
}

// firstControl returns the first LSN in [lo, end] at which the cluster's
// pg_control is stored: there is nothing to restore below it (the
// cluster's first files are stored at the WAL position initdb's output
// was written at).
func firstControl(ctx context.Context, o Options, lo, end pg.LSN) (pg.LSN, error) {
	hi := end
	for lo < hi {
		mid := lo + (hi-lo)/2
		_, err := o.control(ctx, mid)
		switch {
		case err == nil:
			hi = mid
		case errors.Is(err, timeline.ErrNotFound):
			lo = mid + 1
		default:
			return 0, fmt.Errorf("restore: %s at %s: %w", ControlFile, mid, err)
		}
	}
	return lo, nil
}

// runRecovery runs Postgres on the restored folder until it has replayed the
// WAL up to the target and promoted, then stops it cleanly.
func runRecovery(ctx context.Context, srv *postgres.Server, x pg.LSN, res *Result, o Options) (err error) {
	settings := []string{
		"-c restore_command=false", // pg_wal holds the WAL it needs
		"-c hot_standby=off",       // no connection before the end
		"-c archive_mode=off",
		"-c synchronous_standby_names=",
	}
	if !res.EndOfWAL {
		settings = append(settings, "-c recovery_target_lsn="+x.String(),
			"-c recovery_target_inclusive=off", "-c recovery_target_action=promote")
	}
	logf, err := os.OpenFile(srv.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	logf.Close()
	if err := srv.Chown(srv.LogPath); err != nil {
		return err
	}
	cmd, err := srv.Command(ctx, "pg_ctl", "start", "-D", srv.DataDir, "-l", srv.LogPath, "-W", "-s", "-o", strings.Join(settings, " "))
	if err != nil {
		return err
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("restore: pg_ctl start: %v: %s\n%s", err, strings.TrimSpace(string(out)), srv.Tail(2048))
	}
	defer func() {
		if err != nil {
			stopNow(srv, o.Log)
		}
	}()
	o.Progress("Postgres replays the WAL (archive recovery)")
	if err := waitPromoted(ctx, srv, o.Progress); err != nil {
		return err
	}
	o.Progress("promoted; stopping it cleanly")
	if err := srv.Stop(ctx); err != nil {
		return fmt.Errorf("restore: %w\n%s", err, srv.Tail(2048))
	}
	log, _ := os.ReadFile(srv.LogPath)
	res.Stop, res.LastCommit = recoveryLines(string(log))
	return nil
}

// stopNow stops a recovery run that failed, without a checkpoint.
func stopNow(srv *postgres.Server, log zerolog.Logger) {
	if pid, _ := srv.PID(); pid == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd, err := srv.Command(ctx, "pg_ctl", "stop", "-D", srv.DataDir, "-m", "immediate", "-w", "-s")
	if err == nil {
		err = cmd.Run()
	}
	if err != nil {
		log.Warn().Err(err).Str("dir", srv.DataDir).Msg("stopping the restore's Postgres")
	}
}

// waitPromoted waits until the server is out of recovery: its
// postmaster.pid says "ready" (with hot_standby off it says "starting"
// until recovery has ended), and a connection finds it promoted. Until
// then nothing connects, so the log has no refused connections. It fails
// when the postmaster exits, with the tail of its log.
func waitPromoted(ctx context.Context, srv *postgres.Server, progress func(string)) error {
	url := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable connect_timeout=5", srv.DataDir, srv.Port)
	last := ""
	gone := 0
	var err error
	for {
		pid, _ := srv.PID()
		switch {
		case pid == 0:
			// pg_ctl -W returns before the postmaster writes its PID file.
			if gone++; gone > 50 {
				return fmt.Errorf("restore: Postgres stopped during recovery:\n%s", srv.Tail(4096))
			}
		case pmStatus(srv.DataDir) == "ready":
			var ok bool
			if ok, err = promoted(ctx, url); ok {
				return nil
			}
		default:
			if seg, ok := agent.ReplayingSegment(pid, clusterName); ok && seg != last {
				last = seg
				progress("replaying " + seg)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restore: recovery interrupted: %w (last error %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pmStatus returns the postmaster's status in postmaster.pid (its 8th
// line: starting, stopping, ready, standby), or "".
func pmStatus(dataDir string) string {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 8 {
		return ""
	}
	return strings.TrimSpace(lines[7])
}

// recoveryLines finds Postgres' log lines about where recovery stopped and
// the last transaction it replayed.
func recoveryLines(log string) (stop, last string) {
	if m := stopRE.FindAllStringSubmatch(log, -1); len(m) > 0 {
		stop = m[len(m)-1][1]
	}
	if m := lastRE.FindAllStringSubmatch(log, -1); len(m) > 0 {
		last = m[len(m)-1][1]
	}
	return stop, last
}

var (
	stopRE = regexp.MustCompile(`LOG:\s+(recovery stopping [^\n]*)`)
	lastRE = regexp.MustCompile(`last completed transaction was at log time ([^\n]*)`)
)

// chownTree gives every file and folder under dir to uid:gid.
func chownTree(dir string, uid, gid int) error {
	if os.Getuid() != 0 {
		return nil
	}
	return filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}

// DataDirDirs are made even when empty (Postgres needs them).
var dataDirDirs = pageserver.DataDirDirs

// promoted reports whether the server at url accepts connections and is
// out of recovery.
func promoted(ctx context.Context, url string) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(cctx, url)
	if err != nil {
		return false, err
	}
	defer c.Close(cctx)
	var inRecovery bool
	if err := c.QueryRow(cctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		return false, err
	}
	return !inRecovery, nil
}
