package pageserver

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/pg"
)

// relFile matches a relation segment file name: relfilenode, fork, segment.
var relFile = regexp.MustCompile(`^(\d+)(?:_(fsm|vm|init))?(?:\.(\d+))?$`)

var forks = map[string]pg.ForkNumber{"": pg.MainFork, "fsm": pg.FSMFork, "vm": pg.VMFork, "init": pg.InitFork}

// ParseRelPath recognises the data-directory path of a relation segment
// file (global/N, base/DB/N, pg_tblspc/SPC/PG_15_.../DB/N, with an
// optional _fork and .segment suffix).
func ParseRelPath(p string) (pg.RelTag, uint32, bool) {
	parts := strings.Split(p, "/")
	var spc, db uint64
	var name string
	var err error
	switch {
	case len(parts) == 2 && parts[0] == "global":
		spc, name = uint64(pg.GlobalTablespaceOID), parts[1]
	case len(parts) == 3 && parts[0] == "base":
		spc = uint64(pg.DefaultTablespaceOID)
		db, err = strconv.ParseUint(parts[1], 10, 32)
		name = parts[2]
	case len(parts) == 5 && parts[0] == "pg_tblspc" && parts[2] == TablespaceVersionDir:
		spc, err = strconv.ParseUint(parts[1], 10, 32)
		if err == nil {
			db, err = strconv.ParseUint(parts[3], 10, 32)
		}
		name = parts[4]
	default:
		return pg.RelTag{}, 0, false
	}
	m := relFile.FindStringSubmatch(name)
	if err != nil || m == nil {
		return pg.RelTag{}, 0, false
	}
	rel, err := strconv.ParseUint(m[1], 10, 32)
	if err != nil {
		return pg.RelTag{}, 0, false
	}
	var seg uint64
	if m[3] != "" {
		if seg, err = strconv.ParseUint(m[3], 10, 32); err != nil {
			return pg.RelTag{}, 0, false
		}
	}
	return pg.RelTag{Spc: uint32(spc), DB: uint32(db), Rel: uint32(rel), Fork: forks[m[2]]}, uint32(seg), true
}

// skipImport lists data-directory entries that are not part of a timeline:
// WAL lives on the safekeepers, the rest is per-process state.
func skipImport(p string) bool {
	switch p {
	case "postmaster.pid", "postmaster.opts", "pg_wal":
		return true
	}
	return strings.HasPrefix(p, "pg_wal/") || strings.HasSuffix(p, "/pg_internal.init") || p == "pg_internal.init"
}

// ImportTarget is where ImportDataDir writes: a *timeline.Timeline in
// process, or a timeline over gRPC (client.Client.ImportTarget).
type ImportTarget interface {
	Nblocks(ctx context.Context, rel pg.RelTag, lsn pg.LSN) (uint32, bool, error)
	SetRelSize(ctx context.Context, rel pg.RelTag, n uint32, w pg.LSN) error
	PutPages(ctx context.Context, ws []timeline.PageWrite, sizes ...timeline.SizeWrite) (pg.LSN, error)
	WriteFile(ctx context.Context, path string, off int64, data []byte, w pg.LSN) error
	TruncateFile(ctx context.Context, path string, size int64, w pg.LSN) error
}

var _ ImportTarget = (*timeline.Timeline)(nil)

// ImportDataDir loads a stopped Postgres data directory into tl as writes
// at W (gated like any compute write): relation files page by page, every
// other file whole. WAL (pg_wal) and per-process files are skipped. It is
// how a timeline is bootstrapped from initdb (in redo mode, the base WAL
// ingest starts from: initdb writes its pages without WAL), and what tests
// use to compare a pageserver's basebackup with Postgres' own files.
//
// Up to importWorkers files load at once; the segments of one relation
// fork load in order by one worker (a segment extends the fork to its first
// block when the fork is shorter; run beside a later segment, that could
// shrink what the later one wrote meanwhile).
func ImportDataDir(ctx context.Context, tl ImportTarget, dir string, w pg.LSN) error {
	type relSeg struct {
		seg  uint32
		path string
	}
	var files [][2]string // data-directory path, file path
	rels := map[pg.RelTag][]relSeg{}
	var order []pg.RelTag
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if skipImport(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if tag, seg, ok := ParseRelPath(rel); ok {
			if _, seen := rels[tag]; !seen {
				order = append(order, tag)
			}
			rels[tag] = append(rels[tag], relSeg{seg, path})
			return nil
		}
		files = append(files, [2]string{rel, path})
		return nil
	})
	if err != nil {
		return err
	}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(importWorkers)
	for _, tag := range order {
		segs := rels[tag]
		sort.Slice(segs, func(i, j int) bool { return segs[i].seg < segs[j].seg })
		g.Go(func() error {
			for _, s := range segs {
				if err := importRel(ctx, tl, s.path, tag, s.seg, w); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for _, f := range files {
		g.Go(func() error {
			data, err := os.ReadFile(f[1])
			if err != nil {
				return err
			}
			if len(data) == 0 {
				return tl.TruncateFile(ctx, f[0], 0, w)
			}
			return tl.WriteFile(ctx, f[0], 0, data, w)
		})
	}
	return g.Wait()
}

// importWorkers is how many files ImportDataDir loads at once: an import's
// time is mostly round trips to a pageserver and reads through a FUSE
// mount, which overlap.
const importWorkers = 4

func importRel(ctx context.Context, tl ImportTarget, path string, tag pg.RelTag, seg uint32, w pg.LSN) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size()%pg.BlockSize != 0 {
		return fmt.Errorf("pageserver: import %s: size %d is not a multiple of %d", path, st.Size(), pg.BlockSize)
	}
	if n, ok, err := tl.Nblocks(ctx, tag, timeline.LatestLSN); err != nil {
		return err
	} else if !ok || n < seg*RelSegmentBlocks {
		if err := tl.SetRelSize(ctx, tag, seg*RelSegmentBlocks, w); err != nil {
			return err
		}
	}
	first := seg * RelSegmentBlocks
	var batch []timeline.PageWrite
	for blk := uint32(0); ; blk++ {
		p := make([]byte, pg.BlockSize)
		if _, err := io.ReadFull(f, p); err == io.EOF {
			break
		} else if err != nil {
			return err
		}
		batch = append(batch, timeline.PageWrite{Page: tag.Page(first + blk), W: w, Data: p})
		if len(batch) == 256 {
			if _, err := tl.PutPages(ctx, batch); err != nil {
				return err
			}
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		_, err = tl.PutPages(ctx, batch)
	}
	return err
}
