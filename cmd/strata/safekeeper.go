package main

import (
	"fmt"
	"os"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/metrics"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/plugins/objectstore/fs"
	"github.com/stratadb/strata/sdk/objectstore"
)

// newSafekeeperCmd returns `strata safekeeper`: one WAL safekeeper. Its own
// settings are flags (strata up passes them); logging and the archive's
// object store come from the config file.
func newSafekeeperCmd(a *app) *cobra.Command {
	cfg := safekeeper.DefaultConfig()
	var archiveDir string
	var restartOnCrash bool
	var gomaxprocs int
	cmd := &cobra.Command{
		Use:   "safekeeper",
		Short: "Run a WAL safekeeper (the pg-stream replication plugin)",
		Long: `Run one safekeeper: it streams WAL from Postgres 15 with the physical
replication protocol (slot strata_<id>, application_name <id>), writes it into
16 MiB segments under --data-dir/pg_wal, fsyncs with group commit, reports its
flush LSN so that synchronous_standby_names = 'ANY 2 (sk1, sk2, sk3)' counts it,
serves WAL and the election API over gRPC (--listen), and archives segments.

Postgres needs a replication user with a password, for example:
  CREATE ROLE strata_repl LOGIN REPLICATION PASSWORD '...';
  pg_hba.conf: host replication strata_repl 127.0.0.1/32 scram-sha-256`,
		Example: `  strata safekeeper --id sk1 --data-dir /var/lib/strata/sk1 --listen 127.0.0.1:7676 \
    --postgres 'postgres://strata_repl:PW@127.0.0.1:5432/postgres' \
    --peers 127.0.0.1:7677,127.0.0.1:7678 --archive --archive-dir /var/lib/strata/objects`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			full, err := a.load()
			if err != nil {
				return err
			}
			log, err := a.logger(full, "safekeeper")
			if err != nil {
				return err
			}
			nodeLog := log
			log = log.With().Str("safekeeper", cfg.ID).Logger()
			if gomaxprocs < 0 {
				return fmt.Errorf("%w: --gomaxprocs %d: want 0 (Go's default) or more", config.ErrInvalid, gomaxprocs)
			}
			if restartOnCrash {
				return superviseSelf(cmd.Context(), "safekeeper "+cfg.ID, "", nil, log)
			}
			if gomaxprocs > 0 {
				runtime.GOMAXPROCS(gomaxprocs)
			}
			if cfg.Postgres == "" {
				// strata up passes the replication password in the
				// environment rather than in argv.
				cfg.Postgres = os.Getenv("STRATA_SAFEKEEPER_POSTGRES")
			}
			reg := metrics.NewRegistry()
			// The node names itself in its lines: give it the logger
			// without the ID, or every line has the field twice.
			deps := safekeeper.Deps{Logger: nodeLog, Registry: reg}
			if cfg.Archive.Enabled {
				var st objectstore.Store
				if archiveDir != "" {
					st, err = fs.New(fs.Config{Root: archiveDir}, log)
				} else {
					// The object store of the config file (objectstore:).
					st, err = objstore.Open(cmd.Context(), full.ObjectStore, log, reg)
				}
				if err != nil {
					return err
				}
				defer st.Close()
				deps.Archive = st
			}
			n, err := safekeeper.New(cfg, deps)
			if err != nil {
				return err
			}
			return n.Run(cmd.Context())
		},
	}
	safekeeper.BindFlags(cmd.Flags(), &cfg)
	cmd.Flags().IntVar(&gomaxprocs, "gomaxprocs", 0, "Go scheduler processors (0: Go's default, one per core; strata up passes cluster.safekeeper_gomaxprocs, default 1)")
	cmd.Flags().BoolVar(&restartOnCrash, restartOnCrashFlag, false, "run the safekeeper as a child process and start it again when it dies (kill -9, a crash) after it ran 10 s; killing this process kills the safekeeper")
	cmd.Flags().StringVar(&archiveDir, "archive-dir", "", "archive into an fs object store at this folder instead of the config's objectstore (with --archive)")
	return cmd
}
