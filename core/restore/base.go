package restore

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/core/pageserver"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/sdk/pg"
)

// baseResult counts what writeBase wrote.
type baseResult struct {
	files, rels int
	pages       int64
}

// pagesPerBatch is how many pages one GetPages call asks for, and
// fetchWorkers how many relation forks are read at once.
const (
	pagesPerBatch = 256
	fetchWorkers  = 4
)

// writeBase writes every file and relation fork of the cluster at x into
// o.Dir (pg_wal aside, which fetchWAL fills).
func writeBase(ctx context.Context, o Options, x pg.LSN, progress func(string)) (baseResult, error) {
	var res baseResult
	for _, d := range dataDirDirs {
		if err := os.MkdirAll(filepath.Join(o.Dir, d), 0o700); err != nil {
			return res, err
		}
	}
	var (
		files []client.FileInfo
		rels  []pg.RelTag
	)
	err := o.down.ask(ctx, func() (err error) {
		files, rels, err = o.Pageserver.ListFiles(ctx, o.FilesTimeline, x)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("restore: list the files at %s: %w", x, err)
	}
	if o.FilesTimeline != o.Timeline {
		if err := o.down.ask(ctx, func() (err error) {
			_, rels, err = o.Pageserver.ListFiles(ctx, o.Timeline, x)
			return err
		}); err != nil {
			return res, fmt.Errorf("restore: list the relations at %s: %w", x, err)
		}
	}
	for _, f := range files {
		if skipFile(f.Path) {
			continue
		}
		var data []byte
		err := o.down.ask(ctx, func() (err error) {
			data, err = o.Pageserver.GetFile(ctx, o.FilesTimeline, f.Path, x)
			return err
		})
		if err != nil {
			return res, fmt.Errorf("restore: %s at %s: %w", f.Path, x, err)
		}
		if f.Path == psbackend.DirsFile {
			// strata's record of the folders (empty ones too) and their
			// modes: the folders are made, the record is not a file of
			// a stock data directory.
			if err := makeDirs(o.Dir, data); err != nil {
				return res, err
			}
			continue
		}
		p := filepath.Join(o.Dir, filepath.FromSlash(f.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return res, err
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return res, fmt.Errorf("restore: %w", err)
		}
		res.files++
	}
	keep := rels[:0]
	for _, r := range rels {
		// In redo mode the FSM is not rebuilt from WAL (Postgres does
		// not log all of its changes): Postgres makes it again.
		if o.Redo && r.Fork == pg.FSMFork {
			continue
		}
		keep = append(keep, r)
	}
	rels = keep
	sizes := make([]uint32, len(rels))
	var total int64
	for i := 0; i < len(rels); i += 1000 {
		part := rels[i:min(len(rels), i+1000)]
		var got []client.RelSize
		err := o.down.ask(ctx, func() (err error) {
			got, err = o.Pageserver.Nblocks(ctx, o.Timeline, part, x, o.notModifiedSince(x))
			return err
		})
		if err != nil {
			return res, fmt.Errorf("restore: relation sizes at %s: %w", x, err)
		}
		for j, s := range got {
			sizes[i+j] = s.Nblocks
			total += int64(s.Nblocks)
		}
	}
	// A few relation forks at once: each is one worker's, written in
	// order; the batches of the workers share the client's stream.
	var (
		mu   sync.Mutex
		tick = time.Now()
		next = 0
	)
	g, gctx := errgroup.WithContext(ctx)
	for range fetchWorkers {
		g.Go(func() error {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= len(rels) {
					return nil
				}
				err := writeRel(gctx, o, x, rels[i], sizes[i], func(n int) {
					mu.Lock()
					defer mu.Unlock()
					res.pages += int64(n)
					if time.Since(tick) >= time.Second {
						tick = time.Now()
						progress(fmt.Sprintf("pages: %d of %d (%.0f%%)", res.pages, total, 100*float64(res.pages)/float64(max(total, 1))))
					}
				})
				if err != nil {
					return err
				}
				mu.Lock()
				res.rels++
				mu.Unlock()
			}
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	progress(fmt.Sprintf("pages: %d of %d, %d relation forks, %d other files", res.pages, total, res.rels, res.files))
	return res, nil
}

// notModifiedSince: in redo mode a page read at x waits until WAL ingest
// has reached x; writeback versions are there once durable.
func (o Options) notModifiedSince(x pg.LSN) pg.LSN {
	if o.Redo {
		return x
	}
	return 0
}

// writeRel writes the n blocks of relation fork r at x into its segment
// files (an empty first segment when n is 0).
func writeRel(ctx context.Context, o Options, x pg.LSN, r pg.RelTag, n uint32, done func(int)) error {
	var f *os.File
	var seg uint32
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	open := func(s uint32) error {
		if f != nil {
			if err := f.Close(); err != nil {
				return err
			}
		}
		p := filepath.Join(o.Dir, filepath.FromSlash(pageserver.RelPath(r, s)))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return err
		}
		var err error
		f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		seg = s
		return err
	}
	if err := open(0); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	reqs := make([]client.PageRequest, 0, pagesPerBatch)
	for b := uint32(0); b < n; {
		reqs = reqs[:0]
		for ; b < n && len(reqs) < pagesPerBatch; b++ {
			reqs = append(reqs, client.PageRequest{Page: r.Page(b), RequestLSN: x, NotModifiedSince: o.notModifiedSince(x)})
		}
		var got []client.PageResult
		err := o.down.ask(ctx, func() (err error) {
			got, err = o.Pageserver.GetPages(ctx, o.Timeline, reqs)
			for i := 0; err == nil && i < len(got); i++ {
				if outage(got[i].Err) {
					err = got[i].Err // redo mode: ingest behind X after a restart
				}
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("restore: pages of %s at %s: %w", r, x, err)
		}
		for i, pr := range got {
			blk := reqs[i].Page.Block
			if pr.Err != nil {
				return fmt.Errorf("restore: page %s at %s: %w", reqs[i].Page, x, pr.Err)
			}
			if len(pr.Data) != pg.BlockSize {
				return fmt.Errorf("restore: page %s at %s: %d bytes", reqs[i].Page, x, len(pr.Data))
			}
			if s := blk / pageserver.RelSegmentBlocks; s != seg {
				if err := open(s); err != nil {
					return fmt.Errorf("restore: %w", err)
				}
			}
			off := int64(blk%pageserver.RelSegmentBlocks) * pg.BlockSize
			if _, err := f.WriteAt(pr.Data, off); err != nil {
				return fmt.Errorf("restore: %w", err)
			}
		}
		done(len(got))
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	f = nil
	return nil
}

// skipFile reports the stored files a restored data directory leaves
// out: the compute's replication slots (the safekeepers' slots would hold
// WAL in the copy for ever), recovery signals, and files that die with a
// server (not stored by the compute, but a copy made otherwise may have
// them).
// makeDirs makes the folders that psbackend.DirsFile (data) lists under
// dir, with their modes, but those skipFile leaves out (a replication
// slot's folder without its state file would stop Postgres).
func makeDirs(dir string, data []byte) error {
	dirs, err := psbackend.DecodeDirs(data)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	for p, mode := range dirs {
		if skipFile(p) || strings.HasPrefix(p, "/") || strings.Contains(p, "..") {
			continue
		}
		if mode&0o777 == 0 {
			mode = 0o700
		}
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(full, 0o700); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if err := os.Chmod(full, os.FileMode(mode&0o777)); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
	}
	return nil
}

func skipFile(p string) bool {
	switch {
	case strings.HasPrefix(p, "pg_replslot/"), strings.HasPrefix(p, "pg_wal/"), p == "pg_wal":
		return true
	case relpath.Classify(p) == relpath.KindLocal:
		return true
	}
	switch path.Base(p) {
	case "recovery.signal", "standby.signal", "backup_label", "tablespace_map", "postmaster.pid", "postmaster.opts":
		return path.Dir(p) == "."
	}
	return false
}
