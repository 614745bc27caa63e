package cluster

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/pg"
)

// TestStatusPrintProcesses: the process table shows LSNs and a lag only
// for the processes Postgres streams to, and a lag is never negative.
func TestStatusPrintProcesses(t *testing.T) {
	s := &Status{CurrentLSN: 1000, Procs: []ProcStatus{
		{Name: "safekeeper sk1", PID: 10, Alive: true, State: "streaming", SyncState: "quorum", WriteLSN: 1200, FlushLSN: 1100, FlushLagBytes: lagBytes(1000, 1100)},
		{Name: "safekeeper sk2", PID: 11, Alive: true, State: "streaming", SyncState: "quorum", WriteLSN: 900, FlushLSN: 800, FlushLagBytes: lagBytes(1000, 800)},
		{Name: "pageserver", PID: 12, Alive: true},
	}}
	var b strings.Builder
	s.Print(&b)
	rows := map[string]string{}
	for _, l := range strings.Split(b.String(), "\n") {
		for _, p := range s.Procs {
			if strings.HasPrefix(l, p.Name+" ") {
				rows[p.Name] = strings.Join(strings.Fields(l), " ")
			}
		}
	}
	for name, want := range map[string]string{
		"safekeeper sk1": "safekeeper sk1 10 true streaming quorum 0/4B0 0/44C 0 B",
		"safekeeper sk2": "safekeeper sk2 11 true streaming quorum 0/384 0/320 200 B",
		"pageserver":     "pageserver 12 true - - - - -",
	} {
		if rows[name] != want {
			t.Errorf("row %q, want %q; the table:\n%s", rows[name], want, b.String())
		}
	}
}

// TestStatusNotRunning names the dead processes with their PIDs.
func TestStatusNotRunning(t *testing.T) {
	s := &Status{Procs: []ProcStatus{
		{Name: "safekeeper sk1", PID: 10, Alive: true},
		{Name: "safekeeper sk2", PID: 11},
		{Name: "compute", PID: 13},
	}}
	if got, want := strings.Join(s.NotRunning(), ", "), "safekeeper sk2 (pid 11), compute (pid 13)"; got != want {
		t.Fatalf("NotRunning %q, want %q", got, want)
	}
	s.Procs[1].Alive, s.Procs[2].Alive = true, true
	if got := s.NotRunning(); len(got) != 0 {
		t.Fatalf("NotRunning %q with every process alive", got)
	}
}

// TestRPCReason: an unreachable process is reported by its dial error
// alone; other errors whole.
func TestRPCReason(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:7677: connect: connection refused"`), "dial tcp 127.0.0.1:7677: connect: connection refused"},
		{status.Error(codes.Unavailable, "the server is shutting down"), "the server is shutting down"},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), "rpc error: code = DeadlineExceeded desc = context deadline exceeded"},
		{errors.New("plain"), "plain"},
	} {
		if got := rpcReason(c.err); got != c.want {
			t.Errorf("rpcReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

// TestStatusGroupCommit: the group's commit LSN is a majority's flush LSN
// in the highest term, ahead of each safekeeper's own (polled) figure;
// an unreachable safekeeper does not count, and without a majority the
// highest own figure stands.
func TestStatusGroupCommit(t *testing.T) {
	s := &Status{CurrentLSN: 5000, Safekeepers: []SafekeeperStatus{
		{Name: "sk1", Term: 3, Accepted: true, FlushLSN: 5000, CommitLSN: 3000, StartLSN: 1000, ArchivedLSN: 2000},
		{Name: "sk2", Term: 3, Accepted: true, FlushLSN: 4800, CommitLSN: 3100},
		{Name: "sk3", Term: 2, Accepted: true, FlushLSN: 4900, CommitLSN: 2000}, // an older term
	}, Consumers: map[string]server.Feedback{"pageserver-x": {Received: 4800, Durable: 4700, Uploaded: 3000}}}
	if got := groupCommit(s.Safekeepers); got != 4800 {
		t.Fatalf("group commit %d, want 4800 (sk1 and sk2 flushed it in term 3)", got)
	}
	var b strings.Builder
	s.Print(&b)
	if !strings.Contains(b.String(), "safekeepers  commit 0/12C0 (a majority's flush)  commit_lag 200 B") ||
		!strings.Contains(b.String(), "safekeeper sk1  term 3  flush 0/1388  own commit 0/BB8  local WAL from 0/3E8  archived 0/7D0") ||
		!strings.Contains(b.String(), "wal consumer pageserver-x  received 0/12C0  durable 0/125C  uploaded 0/BB8") {
		t.Fatalf("status:\n%s", b.String())
	}
	if strings.Contains(b.String(), "ingest_lag") {
		t.Fatalf("ingest_lag shown for a pageserver that ingests no WAL:\n%s", b.String())
	}
	// A pageserver that follows the WAL shows how far it trails the
	// group's commit LSN.
	s.Timeline, s.PageserverLast, s.IngestsWAL = "abc", 4000, true
	b.Reset()
	s.Print(&b)
	if !strings.Contains(b.String(), "pageserver  timeline abc  last_record 0/FA0  durable 0/0  remote 0/0  gc_cutoff 0/0  ingest_lag 800 B") {
		t.Fatalf("status:\n%s", b.String())
	}
	if strings.Contains(b.String(), "uploads to the object store failing") {
		t.Fatalf("upload trouble shown while uploads work:\n%s", b.String())
	}
	// So are failed archive steps of a safekeeper.
	s.Safekeepers[0].Archive = trouble.Run{Since: time.Date(2026, 12, 6, 21, 4, 0, 0, time.Local), Failures: 2, Err: "archive: put wal/x: the object store stopped answering"}
	// Uploads that fail are said, with since when and why.
	s.PageserverUpload = trouble.Run{Since: time.Date(2026, 12, 6, 21, 3, 45, 0, time.Local), Failures: 4, Err: "objectstore: put \"x\": the object store stopped answering"}
	b.Reset()
	s.Print(&b)
	if !strings.Contains(b.String(), "pageserver  uploads to the object store failing since 21:03:45 (4 in a row): objectstore: put \"x\": the object store stopped answering") {
		t.Fatalf("status with failing uploads:\n%s", b.String())
	}
	if !strings.Contains(b.String(), "safekeeper sk1  archiving to the object store failing since 21:04:00 (2 in a row): archive: put wal/x: the object store stopped answering") ||
		strings.Contains(b.String(), "safekeeper sk2  archiving") {
		t.Fatalf("status with sk1's archiving failing:\n%s", b.String())
	}
	// The archive line: how far the WAL in the store trails the commit.
	for _, tc := range []struct {
		end  pg.LSN
		err  string
		want string
	}{
		{0, "", "archive   no WAL in the object store yet  behind_commit 4.7 KiB"},
		{4000, "", "archive   WAL in the object store to 0/FA0  behind_commit 800 B"},
		{0, "s3: bucket gone", "archive   the WAL in the object store: unknown (s3: bucket gone)"},
	} {
		s.StoreWAL, s.StoreWALErr = tc.end, tc.err
		b.Reset()
		s.Print(&b)
		if !strings.Contains(b.String(), tc.want+"\n") {
			t.Fatalf("status with the WAL in the store to %s (%q): want %q in\n%s", tc.end, tc.err, tc.want, b.String())
		}
	}
	s.Safekeepers[1].Err = "dial tcp 127.0.0.1:7677: connect: connection refused"
	if got := groupCommit(s.Safekeepers); got != 3000 {
		t.Fatalf("group commit %d with one of two term-3 members down, want sk1's own 3000", got)
	}
}

// TestStatusPrintRestoreFrom: the restore line gives the oldest moment, or
// why it is unknown, and is left out when the pageserver said nothing.
func TestStatusPrintRestoreFrom(t *testing.T) {
	at := time.Date(2026, 12, 7, 11, 43, 43, 0, time.Local)
	for _, tc := range []struct {
		s    Status
		want string
	}{
		{Status{RestoreFrom: 0x5F32E20, RestoreFromTime: at}, "restore   from 2026-12-07 11:43:43 "},
		{Status{RestoreFromErr: "restore: pg_control at 0/5F32E20: timeline: LSN is below the GC cutoff"}, "restore   from: unknown (restore: pg_control at 0/5F32E20: timeline: LSN is below the GC cutoff)\n"},
		{Status{}, ""},
	} {
		var b strings.Builder
		tc.s.Print(&b)
		var got string
		for _, l := range strings.SplitAfter(b.String(), "\n") {
			if strings.HasPrefix(l, "restore ") {
				got = l
			}
		}
		if tc.want == "" && got != "" || tc.want != "" && !strings.HasPrefix(got, tc.want) {
			t.Errorf("restore line %q, want it to start with %q", got, tc.want)
		}
	}
}
