package cluster

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

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
}

// Status reads the state file, checks each process and asks Postgres for
// its WAL position and each safekeeper's replication state.
func (c *Cluster) Status(ctx context.Context) (*Status, error) {
	st, err := c.readState()
	if err != nil {
		return nil, err
	}
	pgs := c.postgres()
	s := &Status{URLRedacted: fmt.Sprintf("postgres://postgres:***@127.0.0.1:%d/postgres", st.Port)}
	s.PostgresPID, _ = pgs.PID()
	byName := map[string]*ProcStatus{}
	for _, p := range st.Procs {
		s.Procs = append(s.Procs, ProcStatus{Name: p.Name, PID: p.PID, Alive: p.Alive()})
	}
	for i := range s.Procs {
		byName[s.Procs[i].Name] = &s.Procs[i]
	}
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
		p.FlushLagBytes = int64(s.CurrentLSN) - int64(p.FlushLSN)
	}
	return s, nil
}

// Print writes the status as a table.
func (s *Status) Print(w io.Writer) {
	fmt.Fprintf(w, "postgres  %s  pid %d  current_lsn %s\n", s.URLRedacted, s.PostgresPID, s.CurrentLSN)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PROCESS\tPID\tALIVE\tSTATE\tSYNC\tWRITE_LSN\tFLUSH_LSN\tFLUSH_LAG")
	for _, p := range s.Procs {
		fmt.Fprintf(tw, "%s\t%d\t%v\t%s\t%s\t%s\t%s\t%d B\n", p.Name, p.PID, p.Alive, dash(p.State), dash(p.SyncState), p.WriteLSN, p.FlushLSN, p.FlushLagBytes)
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
