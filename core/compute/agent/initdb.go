package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// initdb makes a new cluster. initdb runs on a local folder of the scratch
// space and its output is then copied into the mount, file by file.
//
// Why not initdb on the mount: initdb's bootstrap and CREATE DATABASE
// write, re-read and re-write each catalog page many times, and every one
// of those is a FUSE round trip and a page write to storage. On a 2-core
// machine that was about 5 s of a 7.5 s first `strata up`; the copy writes
// each of the roughly 40 MB once, in large writes. What lands in storage is
// the same set of files, and pg_wal is a link to the WAL scratch folder
// (initdb -X), whose WAL the mount's tracker walks for W, the position the
// copy's writes are tagged with.
//
// With compute.pg_wal fuse, initdb still runs on the mount: there W comes
// from the WAL writes through the mount (walpos.Tracker.WroteData), and a
// copy of initdb's zero-padded segment would move W past the end of WAL.
func (a *Agent) initdb(ctx context.Context) error {
	if !a.wal.link {
		return a.pgs.InitDB(ctx, a.cfg.Password)
	}
	stage := filepath.Join(a.cfg.Scratch, "initdb")
	if err := os.RemoveAll(stage); err != nil {
		return fmt.Errorf("agent: initdb staging folder: %w", err)
	}
	defer os.RemoveAll(stage)
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return fmt.Errorf("agent: initdb staging folder: %w", err)
	}
	if err := os.Chown(stage, a.uid, a.gid); err != nil {
		return fmt.Errorf("agent: initdb staging folder: %w", err)
	}
	s := *a.pgs
	s.DataDir = filepath.Join(stage, "data")
	t0 := time.Now()
	if err := s.InitDB(ctx, a.cfg.Password); err != nil {
		return err
	}
	t1 := time.Now()
	files, bytes, err := copyTree(ctx, s.DataDir, a.cfg.Mountpoint)
	if err != nil {
		return fmt.Errorf("agent: copying initdb's output into the mount: %w", err)
	}
	a.log.Info().Dur("initdb", t1.Sub(t0)).Dur("copy", time.Since(t1)).Int("files", files).Int64("bytes", bytes).
		Msg("initdb ran on local scratch; its output is copied into the mount")
	return nil
}

// copyTree copies the folder src into the existing folder dst: folders,
// regular files (with their permission bits) and symbolic links. It makes
// the folders and links first, then copies the files, copyWorkers at a time
// (each file's creation is a round trip to storage). It returns the number
// of files and bytes copied. Nothing in dst may exist yet.
func copyTree(ctx context.Context, src, dst string) (int, int64, error) {
	type job struct {
		from, to string
		perm     fs.FileMode
	}
	var jobs []job
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(to, info.Mode().Perm())
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case info.Mode().IsRegular():
			jobs = append(jobs, job{path, to, info.Mode().Perm()})
			return nil
		}
		return fmt.Errorf("%s: not a folder, file or symbolic link (%v)", path, info.Mode())
	})
	if err != nil {
		return 0, 0, err
	}
	var (
		next  atomic.Int64
		bytes atomic.Int64
	)
	g, gctx := errgroup.WithContext(ctx)
	for range copyWorkers {
		g.Go(func() error {
			buf := make([]byte, 1<<20)
			for {
				i := int(next.Add(1)) - 1
				if i >= len(jobs) {
					return nil
				}
				if err := gctx.Err(); err != nil {
					return err
				}
				n, err := copyFile(jobs[i].from, jobs[i].to, jobs[i].perm, buf)
				bytes.Add(n)
				if err != nil {
					return err
				}
			}
		})
	}
	err = g.Wait()
	return len(jobs), bytes.Load(), err
}

// copyWorkers is how many files copyTree copies at once.
const copyWorkers = 8

// copyFile copies one regular file through buf, in writes of up to
// len(buf) bytes (not by copy_file_range, which a FUSE mount may refuse).
func copyFile(from, to string, perm fs.FileMode, buf []byte) (int64, error) {
	in, err := os.Open(from)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return 0, err
	}
	var n int64
	for {
		r, rerr := in.Read(buf)
		if r > 0 {
			w, werr := out.Write(buf[:r])
			n += int64(w)
			if werr != nil {
				out.Close()
				return n, fmt.Errorf("%s: %w", to, werr)
			}
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			out.Close()
			return n, rerr
		}
	}
	if err := out.Close(); err != nil {
		return n, fmt.Errorf("%s: %w", to, err)
	}
	return n, nil
}
