package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/pageserver/sklink"
	"github.com/stratadb/strata/core/restore"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/pg"
)

// ProcStatus is one process in a status report.
type ProcStatus struct {
	Name  string
	PID   int
	Alive bool
	// For safekeepers, as Postgres sees them (pg_stat_replication).
	State              string
	SyncState          string
	WriteLSN, FlushLSN pg.LSN
	FlushLagBytes      int64
}

// Status is what `strata status` prints.
type Status struct {
	URLRedacted string
	PostgresPID int
	CurrentLSN  pg.LSN // pg_current_wal_lsn()
	Procs       []ProcStatus
	// Safekeepers as they report themselves: term, flush and commit LSN.
	Safekeepers []SafekeeperStatus
	// Consumers: each WAL consumer's progress (a pageserver that ingests
	// WAL), the highest any safekeeper reports; the safekeepers remove
	// archived WAL below the lowest durable LSN.
	Consumers map[string]server.Feedback
	// Pageserver: the timeline's LSNs (zero when it does not answer).
	Timeline          string
	PageserverLast    pg.LSN // last record
	PageserverDurable pg.LSN
	PageserverRemote  pg.LSN // remote consistent (in the object store)
	// PageserverGCCutoff: the oldest LSN the pageserver still reads at
	// (storage.pitr and storage.gc_horizon move it up).
	PageserverGCCutoff pg.LSN
	// PageserverLease: the lowest LSN a lease holds GC below (a restore
	// reading there; zero when none).
	PageserverLease pg.LSN
	// PageserverUpload: the current run of failed uploads to the object
	// store (zero when the last one succeeded).
	PageserverUpload trouble.Run
	// RestoreFrom and RestoreFromTime: the oldest moment `strata restore`
	// reaches (zero when unknown: RestoreFromErr says why, unless the
	// pageserver did not answer at all).
	RestoreFrom     pg.LSN
	RestoreFromTime time.Time
	RestoreFromErr  string
	// IngestsWAL: the pageserver follows the safekeepers' WAL (redo mode,
	// or an image policy other than writeback), so its last record should
	// keep up with the group's commit LSN.
	IngestsWAL bool
	// Compute is the agent's report (nil when it does not answer).
	Compute *agent.Report
	// StoreWAL: the end of the WAL in the object store (whole segments and
	// the partial copy of the last one), the newest moment a restore from
	// the store alone reaches (zero, with StoreWALErr, when unknown).
	StoreWAL    pg.LSN
	StoreWALErr string
	// Disk: what each part keeps on local disk; Free: the room left on
	// each filesystem that holds them.
	Disk []DiskUse
	Free []DiskFree
}

// SafekeeperStatus is one safekeeper's own view.
type SafekeeperStatus struct {
	Name                string
	Term                uint64
	Accepted            bool // it applied its term's Accept
	FlushLSN, CommitLSN pg.LSN
	// StartLSN: its oldest local WAL (older WAL, once archived, was
	// removed); ArchivedLSN: all WAL below it is in the object store.
	StartLSN, ArchivedLSN pg.LSN
	// Archive: the current run of failed archive steps (zero when the
	// last one succeeded).
	Archive trouble.Run
	Err     string
}

// Status reads the state file, checks each process and asks Postgres for
// its WAL position and each safekeeper's replication state.
func (c *Cluster) Status(ctx context.Context) (*Status, error) {
	st, err := c.readState()
	if errors.Is(err, ErrNotRunning) {
		if serr := c.strayError(); serr != nil {
			return nil, serr
		}
	}
	if err != nil {
		return nil, err
	}
	pgs := c.postgres()
	s := &Status{URLRedacted: fmt.Sprintf("postgres://postgres:***@127.0.0.1:%d/postgres", st.Port),
		IngestsWAL: c.cfg.Storage.IngestsWAL()}
	s.PostgresPID, _ = pgs.PID()
	byName := map[string]*ProcStatus{}
	for _, p := range st.Procs {
		s.Procs = append(s.Procs, ProcStatus{Name: p.Name, PID: p.PID, Alive: p.Alive()})
	}
	for i := range s.Procs {
		byName[s.Procs[i].Name] = &s.Procs[i]
	}
	c.storageStatus(ctx, st, s)
	c.diskStatus(s)
	if s.PostgresPID == 0 {
		return s, nil
	}
	pw, err := c.secret("postgres.password")
	if err != nil {
		return nil, err
	}
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(qctx, pgs.URL(pw, "postgres"))
	if err != nil {
		return s, nil
	}
	defer conn.Close(qctx)
	var cur string
	if err := conn.QueryRow(qctx, "SELECT pg_current_wal_lsn()::text").Scan(&cur); err == nil {
		s.CurrentLSN, _ = pg.ParseLSN(cur)
	}
	rows, err := conn.Query(qctx, `SELECT application_name, state, sync_state,
		coalesce(write_lsn::text, '0/0'), coalesce(flush_lsn::text, '0/0')
		FROM pg_stat_replication`)
	if err != nil {
		return s, nil
	}
	defer rows.Close()
	for rows.Next() {
		var name, state, sync, w, f string
		if err := rows.Scan(&name, &state, &sync, &w, &f); err != nil {
			break
		}
		p := byName["safekeeper "+name]
		if p == nil {
			continue
		}
		p.State, p.SyncState = state, sync
		p.WriteLSN, _ = pg.ParseLSN(w)
		p.FlushLSN, _ = pg.ParseLSN(f)
		p.FlushLagBytes = lagBytes(s.CurrentLSN, p.FlushLSN)
	}
	return s, nil
}

// storageStatus asks the safekeepers, the pageserver and the compute agent.
func (c *Cluster) storageStatus(ctx context.Context, st *State, s *Status) {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var systemID uint64
	for i, id := range c.safekeeperIDs() {
		ss := SafekeeperStatus{Name: id}
		if cl, err := server.Dial(c.safekeeperAddr(i)); err != nil {
			ss.Err = err.Error()
		} else {
			if r, err := cl.Status(qctx); err != nil {
				ss.Err = rpcReason(err)
			} else {
				ss.Term, ss.Accepted, ss.FlushLSN, ss.CommitLSN = r.Term, r.Accepted, r.FlushLSN, r.CommitLSN
				ss.StartLSN, ss.ArchivedLSN, ss.Archive = r.StartLSN, r.ArchivedLSN, r.Archive
				systemID = max(systemID, r.SystemID)
				for id, fb := range r.Consumers {
					if s.Consumers == nil {
						s.Consumers = map[string]server.Feedback{}
					}
					s.Consumers[id] = s.Consumers[id].Max(fb)
				}
			}
			cl.Close()
		}
		s.Safekeepers = append(s.Safekeepers, ss)
	}
	s.Timeline = st.Timeline
	if tl, err := pg.ParseTimelineID(st.Timeline); err == nil && st.Pageserver != "" {
		if cl, err := client.Dial(st.Pageserver); err == nil {
			filesTL := tl
			if st.FilesTimeline != "" {
				filesTL, _ = pg.ParseTimelineID(st.FilesTimeline)
			}
			if tls, err := cl.ListTimelines(qctx); err == nil {
				for _, t := range tls {
					if t.ID == tl {
						s.PageserverLast, s.PageserverDurable, s.PageserverRemote = t.LSNs.LastRecord, t.LSNs.Durable, t.LSNs.RemoteConsistent
						s.PageserverGCCutoff = t.LSNs.GCCutoff
						s.PageserverUpload = t.Upload
					}
					if l := t.LSNs.Lease; (t.ID == tl || t.ID == filesTL) && l > 0 && (s.PageserverLease == 0 || l < s.PageserverLease) {
						s.PageserverLease = l
					}
				}
			}
			if lsn, at, err := restore.Oldest(qctx, cl, tl, filesTL); err == nil {
				s.RestoreFrom, s.RestoreFromTime = lsn, at
			} else {
				s.RestoreFromErr = err.Error()
			}
			cl.Close()
		}
	}
	if st.Compute != "" {
		req, _ := http.NewRequestWithContext(qctx, http.MethodGet, "http://"+st.Compute+"/waits", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			var r agent.Report
			if json.NewDecoder(resp.Body).Decode(&r) == nil {
				s.Compute = &r
			}
			resp.Body.Close()
		}
	}
	if systemID != 0 {
		// Last, on a clock of its own: a store that does not answer
		// must not cost the lines above.
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		s.StoreWAL, s.StoreWALErr = c.storeWAL(sctx, systemID)
		cancel()
	}
}

// storeWAL returns the end of the cluster's WAL in the object store, or
// why it is not known.
func (c *Cluster) storeWAL(ctx context.Context, systemID uint64) (pg.LSN, string) {
	const silent = "the object store did not answer within 3 s"
	st, err := objstore.Open(ctx, c.cfg.ObjectStore, zerolog.Nop(), nil)
	if err != nil {
		if ctx.Err() != nil {
			return 0, silent
		}
		return 0, err.Error()
	}
	defer st.Close()
	end, err := archivedEnd(ctx, st, "wal", systemID)
	if err != nil {
		if ctx.Err() != nil {
			return 0, silent
		}
		return 0, err.Error()
	}
	return end, ""
}

// Print writes the status as a table.
func (s *Status) Print(w io.Writer) {
	fmt.Fprintf(w, "postgres  %s  pid %d  current_lsn %s\n", s.URLRedacted, s.PostgresPID, s.CurrentLSN)
	if r := s.Compute; r != nil {
		fmt.Fprintf(w, "compute   %s  term %d  E %s  W %s  durable %s  restarts %d  last start %s  cache %s\n",
			r.State, r.Term, r.DurableEnd, r.W, r.Durable, r.Restarts, r.ColdStart, r.Strategy)
		if p := r.Progress; p != nil {
			fmt.Fprintf(w, "compute   %s: %s, for %s (last progress %s ago)\n", p.Verb(), p, p.Elapsed, p.Idle)
		}
	}
	if s.Timeline != "" {
		ingest := ""
		if s.IngestsWAL && len(s.Safekeepers) > 0 && s.PageserverLast > 0 {
			// WAL the group committed that ingest has not reached: a
			// figure that only grows means ingest is stuck (its log says
			// why).
			ingest = fmt.Sprintf("  ingest_lag %d B", lagBytes(groupCommit(s.Safekeepers), s.PageserverLast))
		}
		lease := ""
		if s.PageserverLease > 0 {
			// A restore is reading: GC stays at or below this.
			lease = fmt.Sprintf("  held at %s by a lease (a restore)", s.PageserverLease)
		}
		fmt.Fprintf(w, "pageserver  timeline %s  last_record %s  durable %s  remote %s  gc_cutoff %s%s%s\n", s.Timeline, s.PageserverLast, s.PageserverDurable, s.PageserverRemote, s.PageserverGCCutoff, lease, ingest)
		if u := s.PageserverUpload; u.Failures > 0 {
			// remote stays behind while this lasts; the data is safe on
			// the pageserver's disk and in the safekeepers.
			fmt.Fprintf(w, "pageserver  uploads to the object store failing since %s (%d in a row): %s\n",
				u.Since.Local().Format("15:04:05"), u.Failures, u.Err)
		}
	}
	switch {
	case s.RestoreFrom > 0:
		fmt.Fprintf(w, "restore   from %s (%s) on: strata restore --at LSN|TIME --to DIR\n", s.RestoreFromTime.Local().Format("2006-01-02 15:04:05 -07:00"), s.RestoreFrom)
	case s.RestoreFromErr != "":
		fmt.Fprintf(w, "restore   from: unknown (%s)\n", s.RestoreFromErr)
	}
	if len(s.Safekeepers) > 0 {
		c := groupCommit(s.Safekeepers)
		fmt.Fprintf(w, "safekeepers  commit %s (a majority's flush)  commit_lag %d B\n", c, lagBytes(s.CurrentLSN, c))
		// What a restore from the object store alone would miss were
		// the safekeepers' disks lost now.
		switch {
		case s.StoreWALErr != "":
			fmt.Fprintf(w, "archive   the WAL in the object store: unknown (%s)\n", s.StoreWALErr)
		case s.StoreWAL == 0 && c > 0:
			fmt.Fprintf(w, "archive   no WAL in the object store yet  behind_commit %s\n", fmtBytes(uint64(c)))
		case c > 0:
			fmt.Fprintf(w, "archive   WAL in the object store to %s  behind_commit %s\n", s.StoreWAL, fmtBytes(uint64(lagBytes(c, s.StoreWAL))))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(s.Consumers)) {
		fb := s.Consumers[id]
		fmt.Fprintf(w, "wal consumer %s  received %s  durable %s  uploaded %s\n", id, fb.Received, fb.Durable, fb.Uploaded)
	}
	for _, k := range s.Safekeepers {
		if k.Err != "" {
			fmt.Fprintf(w, "safekeeper %s  unreachable: %s\n", k.Name, k.Err)
			continue
		}
		fmt.Fprintf(w, "safekeeper %s  term %d  flush %s  own commit %s  local WAL from %s  archived %s\n",
			k.Name, k.Term, k.FlushLSN, k.CommitLSN, k.StartLSN, k.ArchivedLSN)
		if a := k.Archive; a.Failures > 0 {
			// The WAL stays on local disk until it is archived.
			fmt.Fprintf(w, "safekeeper %s  archiving to the object store failing since %s (%d in a row): %s\n",
				k.Name, a.Since.Local().Format("15:04:05"), a.Failures, a.Err)
		}
	}
	s.printDisk(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tPID\tALIVE\tSTATE\tSYNC\tWRITE_LSN\tFLUSH_LSN\tFLUSH_LAG")
	for _, p := range s.Procs {
		wl, fl, lag := "-", "-", "-"
		if p.State != "" { // a walsender streams to it
			wl, fl, lag = p.WriteLSN.String(), p.FlushLSN.String(), fmt.Sprintf("%d B", p.FlushLagBytes)
		}
		fmt.Fprintf(tw, "%s\t%d\t%v\t%s\t%s\t%s\t%s\t%s\n", p.Name, p.PID, p.Alive, dash(p.State), dash(p.SyncState), wl, fl, lag)
	}
	tw.Flush()
}

// groupCommit is the commit LSN that the safekeepers' reports prove, as the
// pageserver computes it (sklink.Quorum: a majority's flush LSN in the
// highest term, or the highest commit LSN one reports); each safekeeper's
// own figure can trail it by its idle peer poll.
func groupCommit(sks []SafekeeperStatus) pg.LSN {
	peers := make([]sklink.Peer, 0, len(sks))
	for _, k := range sks {
		peers = append(peers, sklink.Peer{Addr: k.Name, Up: k.Err == "", Term: k.Term, Accepted: k.Accepted, Flush: k.FlushLSN, Commit: k.CommitLSN})
	}
	return sklink.Quorum(peers, len(sks))
}

// NotRunning names the processes of the cluster that are not alive (none:
// all run), each with the PID it had.
func (s *Status) NotRunning() []string {
	var dead []string
	for _, p := range s.Procs {
		if !p.Alive {
			dead = append(dead, fmt.Sprintf("%s (pid %d)", p.Name, p.PID))
		}
	}
	return dead
}

// rpcReason shortens the error of a call to a process that is not there:
// gRPC wraps the dial error in three layers of descriptions, and the last
// one ("dial tcp 127.0.0.1:7677: connect: connection refused") says it all.
func rpcReason(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return err.Error()
	}
	msg := st.Message()
	if i := strings.LastIndex(msg, "dial tcp "); i >= 0 {
		return strings.TrimRight(msg[i:], `"`)
	}
	return msg
}

// lagBytes is how far at is behind cur, never below zero: cur is read
// apart from at, and under load a safekeeper has flushed past the position
// read a moment before, which is no lag at all.
func lagBytes(cur, at pg.LSN) int64 { return max(0, int64(cur)-int64(at)) }

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
