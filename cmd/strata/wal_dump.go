package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/plugins/redo/postgres"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// newWALDumpCmd returns `strata wal dump`: pg_waldump for strata, reading
// WAL segment files from a folder or given on the command line.
func newWALDumpCmd() *cobra.Command {
	var (
		dir, start, end, stats string
		rmgrs                  []string
		limit                  int
	)
	cmd := &cobra.Command{
		Use:   "dump [SEGMENT_FILE...]",
		Short: "Print WAL records or statistics like pg_waldump",
		Long: `Decode PostgreSQL 15 WAL and print one line per record (resource manager,
lengths, xid, LSN, type, description, block references), or with --stats
per-rmgr (--stats=record: per record type) counts and full page image bytes,
in pg_waldump's layout. Give --dir (such as a pg_wal folder) or segment files.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				src *wal.DirSource
				err error
			)
			switch {
			case len(args) > 0:
				src, err = wal.FileSource(args...)
			case dir != "":
				src, err = wal.OpenDir(dir)
			default:
				return fmt.Errorf("give --dir or segment files")
			}
			if err != nil {
				return err
			}
			defer src.Close()
			opts := postgres.DumpOptions{Limit: limit}
			if start != "" {
				if opts.Start, err = pg.ParseLSN(start); err != nil {
					return err
				}
			} else if segs := src.Segments(); len(segs) > 0 {
				opts.Start = pg.LSN(segs[0] * src.SegmentSize())
			}
			if end != "" {
				if opts.End, err = pg.ParseLSN(end); err != nil {
					return err
				}
			}
			switch stats {
			case "":
			case "rmgr", "true":
				opts.Stats = true
			case "record":
				opts.Stats, opts.PerRecord = true, true
			default:
				return fmt.Errorf("--stats=%s: want rmgr or record", stats)
			}
			for _, name := range rmgrs {
				for _, n := range strings.Split(name, ",") {
					id, ok := wal.RmgrByName(n)
					if !ok {
						return fmt.Errorf("unknown resource manager %q", n)
					}
					opts.Rmgrs = append(opts.Rmgrs, id)
				}
			}
			return postgres.Dump(cmd.OutOrStdout(), src, opts)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "dir", "", "folder holding WAL segment files (e.g. "+filepath.Join("PGDATA", "pg_wal")+")")
	f.StringVarP(&start, "start", "s", "", "start LSN (default: the first segment's start)")
	f.StringVarP(&end, "end", "e", "", "stop before records that end after this LSN")
	f.StringVar(&stats, "stats", "", "print statistics instead of records: rmgr or record")
	f.Lookup("stats").NoOptDefVal = "rmgr"
	f.StringSliceVarP(&rmgrs, "rmgr", "r", nil, "only records of these resource managers (e.g. Heap,Btree)")
	f.IntVarP(&limit, "limit", "n", 0, "stop after this many records")
	return cmd
}
