package pageserver

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"path"
	"sort"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// DataDirDirs are the directories of a PostgreSQL 15 data directory that
// must exist (possibly empty) for the server to start.
var DataDirDirs = []string{
	"base", "global", "pg_commit_ts", "pg_dynshmem", "pg_logical", "pg_logical/mappings",
	"pg_logical/snapshots", "pg_multixact", "pg_multixact/members", "pg_multixact/offsets",
	"pg_notify", "pg_replslot", "pg_serial", "pg_snapshots", "pg_stat", "pg_stat_tmp",
	"pg_subtrans", "pg_tblspc", "pg_twophase", "pg_wal", "pg_wal/archive_status", "pg_xact",
}

// RelSegmentBlocks is the number of blocks per relation segment file (1 GiB).
const RelSegmentBlocks = 131072

// TablespaceVersionDir is PG 15's per-version directory inside a tablespace.
const TablespaceVersionDir = "PG_15_202209061"

// RelPath returns the data-directory path of segment seg of a relation fork.
func RelPath(r pg.RelTag, seg uint32) string {
	var p string
	switch r.Spc {
	case pg.GlobalTablespaceOID:
		p = fmt.Sprintf("global/%d", r.Rel)
	case pg.DefaultTablespaceOID:
		p = fmt.Sprintf("base/%d/%d", r.DB, r.Rel)
	default:
		p = fmt.Sprintf("pg_tblspc/%d/%s/%d/%d", r.Spc, TablespaceVersionDir, r.DB, r.Rel)
	}
	if r.Fork != pg.MainFork {
		p += "_" + r.Fork.String()
	}
	if seg > 0 {
		p += fmt.Sprintf(".%d", seg)
	}
	return p
}

// Basebackup writes a tar of the data directory at lsn: every non-relation
// file, then every relation fork (split into 1 GiB segments), page by page.
// In writeback mode the tar is what the newest versions at or below lsn
// hold; Postgres' crash recovery makes it consistent (DESIGN.md 3a).
func Basebackup(ctx context.Context, tl *timeline.Timeline, lsn pg.LSN, w io.Writer) error {
	tw := tar.NewWriter(w)
	mod := time.Unix(0, 0)
	files, err := tl.ListFiles(ctx, lsn)
	if err != nil {
		return err
	}
	rels, err := tl.ListRels(ctx, keyspace.RelsRange, lsn)
	if err != nil {
		return err
	}
	// Directories first: Postgres' fixed ones (empty ones included), then
	// every parent of a file.
	dirs := map[string]bool{}
	var order []string
	addDir := func(d string) {
		for d != "." && d != "" && !dirs[d] {
			dirs[d] = true
			order = append(order, d)
			d = path.Dir(d)
		}
	}
	for _, d := range DataDirDirs {
		addDir(d)
	}
	for _, f := range files {
		addDir(path.Dir(f.Path))
	}
	for _, r := range rels {
		addDir(path.Dir(RelPath(r, 0)))
	}
	sort.Strings(order)
	for _, d := range order {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o700, ModTime: mod, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	for _, f := range files {
		data, err := tl.ReadFile(ctx, f.Path, lsn)
		if err != nil {
			return fmt.Errorf("basebackup: %s: %w", f.Path, err)
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Path, Mode: 0o600, Size: int64(len(data)), ModTime: mod, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	for _, r := range rels {
		n, _, err := tl.Nblocks(ctx, r, lsn)
		if err != nil {
			return err
		}
		for seg := uint32(0); seg == 0 || seg*RelSegmentBlocks < n; seg++ {
			first := seg * RelSegmentBlocks
			cnt := min(n-first, RelSegmentBlocks)
			if n == 0 {
				cnt = 0
			}
			hdr := &tar.Header{Name: RelPath(r, seg), Mode: 0o600, Size: int64(cnt) * pg.BlockSize, ModTime: mod, Typeflag: tar.TypeReg}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			for b := first; b < first+cnt; b++ {
				page, err := tl.GetPage(ctx, r.Page(b), lsn, 0)
				if err != nil {
					return fmt.Errorf("basebackup: %s: %w", r.Page(b), err)
				}
				if _, err := tw.Write(page); err != nil {
					return err
				}
			}
		}
	}
	return tw.Close()
}
