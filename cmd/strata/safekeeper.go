package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/logging"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/plugins/objectstore/fs"
)

// newSafekeeperCmd returns `strata safekeeper`: one WAL safekeeper. Until the
// root command hands it the YAML config (key safekeeper:), every setting is
// also a flag, so it runs standalone.
func newSafekeeperCmd() *cobra.Command {
	cfg := safekeeper.DefaultConfig()
	var archiveDir, logLevel, logFormat string
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
			log, err := logging.New(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			log = log.With().Str("component", "safekeeper").Logger()
			if cfg.Postgres == "" {
				// strata up passes the replication password in the
				// environment rather than in argv.
				cfg.Postgres = os.Getenv("STRATA_SAFEKEEPER_POSTGRES")
			}
			deps := safekeeper.Deps{Logger: log}
			if archiveDir != "" {
				st, err := fs.New(fs.Config{Root: archiveDir}, log)
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
	cmd.Flags().StringVar(&archiveDir, "archive-dir", "", "fs object store root to archive WAL into (with --archive)")
	cmd.Flags().StringVar(&logLevel, "safekeeper-log-level", "info", "log level (debug, info, warn, error)")
	cmd.Flags().StringVar(&logFormat, "safekeeper-log-format", "auto", "log format (auto, json, console)")
	return cmd
}
