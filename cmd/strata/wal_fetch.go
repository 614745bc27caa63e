package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/plugins/objectstore/fs"
)

// newWALFetchCmd returns `strata wal fetch SEGMENT DEST`, usable as Postgres'
// restore_command ('strata wal fetch %f %p --safekeepers ...'): it copies a
// WAL segment from the first safekeeper that holds it (only quorum-committed
// WAL) or else from the archive, and exits non-zero when neither has it.
func newWALFetchCmd(a *app) *cobra.Command {
	var (
		o          safekeeper.FetchOptions
		archiveDir string
		noArchive  bool
	)
	cmd := &cobra.Command{
		Use:     "fetch SEGMENT DEST",
		Short:   "Fetch a WAL segment from the safekeepers or the archive (restore_command)",
		Example: `  restore_command = 'strata wal fetch %f %p --safekeepers 127.0.0.1:7676,127.0.0.1:7677 --archive-dir /var/lib/strata/objects'`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, dest := args[0], args[1]
			switch {
			case archiveDir != "":
				st, err := fs.New(fs.Config{Root: archiveDir}, zerolog.Nop())
				if err != nil {
					return err
				}
				defer st.Close()
				o.Archive = st
			case !noArchive:
				// The object store of the config file.
				full, err := a.load()
				if err != nil {
					return err
				}
				log, err := a.logger(full, "wal-fetch")
				if err != nil {
					return err
				}
				st, err := objstore.Open(cmd.Context(), full.ObjectStore, log, nil)
				if err != nil {
					return err
				}
				defer st.Close()
				o.Archive = st
			}
			tmp, err := os.CreateTemp(filepath.Dir(dest), ".strata-fetch-*")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			if err := safekeeper.FetchSegment(cmd.Context(), o, name, tmp); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Sync(); err != nil {
				tmp.Close()
				return err
			}
			if err := tmp.Close(); err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), dest); err != nil {
				return fmt.Errorf("wal fetch: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringSliceVar(&o.Safekeepers, "safekeepers", nil, "gRPC addresses of safekeepers, tried in order (list the whole group: the last segment is read up to its highest flush LSN, as that WAL is known committed)")
	cmd.Flags().DurationVar(&o.TailWait, "tail-wait", safekeeper.DefaultTailWait, "at most this long for the last segment's WAL past a safekeeper's commit LSN to be known committed")
	cmd.Flags().StringVar(&archiveDir, "archive-dir", "", "read the archive from an fs object store at this folder instead of the config's objectstore")
	cmd.Flags().BoolVar(&noArchive, "no-archive", false, "ask the safekeepers only")
	cmd.Flags().StringVar(&o.Prefix, "archive-prefix", "wal", "object key prefix of archived WAL")
	cmd.Flags().Uint64Var(&o.SystemID, "system-id", 0, "Postgres system identifier in the archive (default: from a safekeeper, or the only one)")
	return cmd
}
