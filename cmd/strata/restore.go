package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/cluster"
	"github.com/stratadb/strata/core/restore"
)

func newRestoreCmd(a *app) *cobra.Command {
	var (
		at, to    string
		port      int
		fromStore bool
		names     cluster.StoreTimelines
	)
	cmd := &cobra.Command{
		Use:   "restore --at LSN|TIME --to DIR",
		Short: "Write the cluster's database as it was at an earlier LSN or time into a new PostgreSQL data directory",
		Long: `Write the database of the running cluster as it was at an earlier moment into
a new folder: a stock PostgreSQL 15 data directory, recovered to that moment,
promoted, shut down cleanly, and ready to start on its own (for example to copy
back a table dropped by mistake with pg_dump). The cluster keeps running and is
not changed.

--at is a WAL position (everything that starts before it, like 0/3A2F1C8), a
time (every transaction that committed at or before it: "2026-12-06 13:40:00"
in the local zone, or RFC 3339 such as 2026-12-06T13:40:00Z), or latest (the
newest durable WAL). The pageserver keeps the page history of storage.pitr
(default 1h) and storage.gc_horizon; an older moment is refused, and strata
status says how far back a restore reaches. The pages come from the
pageserver, the WAL from the safekeepers and the object store's archive.

With --from-store the cluster need not run, nor its folder exist: a read-only
pageserver opened in this process reads the object store, and the WAL comes
from the archive alone, so the newest moment is the older of the store's
newest manifest and the archived WAL (strata down leaves both complete).
Without the cluster's folder the superuser's password is gone too: the
copy is reached over its Unix socket as the postgres OS user.

The restored server keeps the cluster's roles and passwords, listens on
127.0.0.1 at --port (default: a port free now), and is left stopped: the
command to start it and its connection string are printed at the end.`,
		Example: `  strata restore --at "2026-12-06 13:40:00" --to /var/lib/strata-restore
  strata restore --at 0/3A2F1C8 --to /tmp/before-drop --port 5499
  strata restore --from-store --at latest --to /var/lib/strata-restore`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			target, err := restore.ParseTarget(at)
			if err != nil {
				return err
			}
			c, err := a.cluster()
			if err != nil {
				return err
			}
			var r *cluster.Restored
			if fromStore {
				r, err = c.RestoreFromStore(cmd.Context(), target, to, port, names, progressLine)
			} else {
				r, err = c.Restore(cmd.Context(), target, to, port, progressLine)
			}
			if err != nil {
				return err
			}
			fmt.Printf("restored %s to %s in %s\n", target, r.Dir, r.Took.Round(100_000_000))
			if r.EndOfWAL {
				fmt.Printf("  WAL position: %s (no WAL after it yet: every record up to %s)\n", r.LSN, r.Consistent)
			} else {
				fmt.Printf("  WAL position: %s (every record that starts before it)\n", r.LSN)
			}
			if r.Stop != "" {
				fmt.Printf("  Postgres: %s\n", r.Stop)
			}
			if r.LastCommit != "" {
				fmt.Printf("  last transaction replayed: committed at %s\n", r.LastCommit)
			}
			pagesAt := ""
			if r.PagesAt < r.LSN {
				pagesAt = fmt.Sprintf(" as of %s, the store's newest", r.PagesAt)
			}
			fmt.Printf("  %d relation forks (%d pages%s), %d other files, %d WAL segments; recovery from checkpoint %s (REDO %s); log %s\n",
				r.Relations, r.Pages, pagesAt, r.Files, r.Segments, r.Checkpoint, r.Redo, r.LogFile)
			fmt.Printf("start it:  %s\n", r.Start)
			fmt.Printf("connect:   %s\n", r.URL)
			if r.PasswordLost != "" {
				fmt.Printf("password:  %s\n", r.PasswordLost)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&at, "at", "", "the moment to restore to: an LSN (0/3A2F1C8), a time (\"2026-12-06 13:40:00\", RFC 3339) or latest")
	cmd.Flags().StringVar(&to, "to", "", "the new data directory (must not exist, or be empty)")
	cmd.Flags().IntVar(&port, "port", 0, "the restored server's port on 127.0.0.1 (default: one free now)")
	cmd.Flags().BoolVar(&fromStore, "from-store", false, "read the object store alone (a cluster whose machine or data folder is lost, or that is stopped): pages from a read-only pageserver opened in this process, WAL from the archive")
	cmd.Flags().StringVar(&names.Timeline, "timeline", "", "with --from-store: the timeline to restore (default: the cluster folder's, else the store's only one)")
	cmd.Flags().StringVar(&names.FilesTimeline, "files-timeline", "", "with --from-store, redo mode: the timeline of the non-relation files")
	_ = cmd.MarkFlagRequired("at")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}
