package agent

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
)

// initdb makes a new cluster. initdb runs on a local folder of the scratch
// space and its output is then copied into the mount.
//
// Why not initdb on the mount: initdb's bootstrap and CREATE DATABASE
// write, re-read and re-write each catalog page many times, and every one
// of those is a FUSE round trip and a page write to storage. On a 2-core
// machine that was about 5 s of a 7.5 s first `strata up`; the copy writes
// each of the roughly 23 MB once, in large writes. What lands in storage is
// the same set of files, and pg_wal is a link to the WAL scratch folder
// (initdb -X), whose WAL the mount's tracker walks for W, the position the
// copy's writes are tagged with.
//
// With compute.pg_wal fuse, initdb still runs on the mount: there W comes
// from the WAL writes through the mount (walpos.Tracker.WroteData), and a
// copy of initdb's zero-padded segment would move W past the end of WAL.
//
// initdb returns the folder that holds initdb's output for the redo
// import to read (the staging folder: local reads, and no I/O of the agent
// on its own mount), and done, which removes it.
func (a *Agent) initdb(ctx context.Context) (out string, done func(), err error) {
	if !a.wal.link {
		return a.cfg.Mountpoint, func() {}, a.pgs.InitDB(ctx, a.cfg.Password)
	}
	stage := filepath.Join(a.cfg.Scratch, "initdb")
	done = func() { os.RemoveAll(stage) }
	if err := os.RemoveAll(stage); err != nil {
		return "", nil, fmt.Errorf("agent: initdb staging folder: %w", err)
	}
	fail := func(err error) (string, func(), error) {
		done()
		return "", nil, err
	}
	if err := os.MkdirAll(stage, 0o755); err != nil {
		return fail(fmt.Errorf("agent: initdb staging folder: %w", err))
	}
	if err := os.Chown(stage, a.uid, a.gid); err != nil {
		return fail(fmt.Errorf("agent: initdb staging folder: %w", err))
	}
	s := *a.pgs
	s.DataDir = filepath.Join(stage, "data")
	t0 := time.Now()
	if err := s.InitDB(ctx, a.cfg.Password); err != nil {
		return fail(err)
	}
	t1 := time.Now()
	// A copy cut short (the agent killed) leaves writes that never become
	// durable: the safekeepers hold none of initdb's WAL yet, so the next
	// start finds an empty timeline and runs initdb again. pg_control goes
	// last all the same: should part of a copy be stored, a timeline
	// without it is reported as an initdb that never finished, instead of
	// Postgres starting on half a data folder.
	files, size, err := copyTree(ctx, s.DataDir, a.cfg.Mountpoint, ControlFile)
	if err != nil {
		return fail(fmt.Errorf("agent: copying initdb's output into the mount: %w", err))
	}
	a.log.Info().Dur("initdb", t1.Sub(t0)).Dur("copy", time.Since(t1)).Int("files", files).Int64("bytes", size).
		Msg("initdb ran on local scratch; its output is copied into the mount")
	return s.DataDir, done, nil
}

// copyTree copies the contents of the folder src into the folder dst
// (folders, regular files, symbolic links as links; see cp for the modes),
// and the files named in last (slash-separated, relative to src)
// only once everything else is copied. It returns the number of regular
// files and their bytes. The caller makes sure dst holds none of src's
// names (a new timeline's mount is empty). src is only read.
//
// The copy runs in child processes (cp), not in the agent: dst is the
// agent's own FUSE mount, and a thread of the agent blocked in a request
// to its own mount when the agent is killed never returns (the mount's
// connection closes only once every thread has exited), leaving an
// unkillable process that holds the mount and the agent's ports. A child's
// request fails instead once the agent is gone.
func copyTree(ctx context.Context, src, dst string, last ...string) (int, int64, error) {
	skip := map[string]bool{}
	for _, rel := range last {
		skip[rel] = true
	}
	files, size, err := copyTreeSkipping(ctx, src, dst, skip)
	if err != nil {
		return 0, 0, err
	}
	for _, rel := range last {
		info, err := os.Stat(filepath.Join(src, filepath.FromSlash(rel)))
		if err != nil {
			return 0, 0, err
		}
		if err := cp(ctx, filepath.Join(src, filepath.FromSlash(rel)), filepath.Join(dst, filepath.FromSlash(rel))); err != nil {
			return 0, 0, err
		}
		files++
		size += info.Size()
	}
	return files, size, nil
}

// copyTreeSkipping copies the contents of src into dst, leaving out the
// entries named in skip (slash-separated paths relative to src; a folder
// is left out whole). It returns the regular files copied and their
// bytes. cp runs once per entry, copyWorkers at a time, and once per
// database folder of base/: the kernel serializes file creations in one
// folder, so the databases' folders are copied side by side. A folder
// that holds a skipped entry is made, and its other entries copied one
// by one.
func copyTreeSkipping(ctx context.Context, src, dst string, skip map[string]bool) (int, int64, error) {
	files, size, err := treeSize(src, skip)
	if err != nil {
		return 0, 0, err
	}
	var pairs [][2]string
	var expand func(rel string) error
	expand = func(rel string) error {
		ents, err := os.ReadDir(filepath.Join(src, filepath.FromSlash(rel)))
		if err != nil {
			return err
		}
		for _, e := range ents {
			r := e.Name()
			if rel != "" {
				r = rel + "/" + e.Name()
			}
			from, to := filepath.Join(src, filepath.FromSlash(r)), filepath.Join(dst, filepath.FromSlash(r))
			if skip[r] {
				continue
			}
			if !e.IsDir() || (r != "base" && !holdsSkipped(r, skip)) {
				pairs = append(pairs, [2]string{from, to})
				continue
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			if err := os.Mkdir(to, info.Mode().Perm()); err != nil {
				return err
			}
			if err := expand(r); err != nil {
				return err
			}
		}
		return nil
	}
	if err := expand(""); err != nil {
		return 0, 0, err
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(copyWorkers)
	for _, p := range pairs {
		g.Go(func() error { return cp(gctx, p[0], p[1]) })
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	return files, size, nil
}

// treeSize returns the regular files under src, but those in skip, and
// their bytes.
func treeSize(src string, skip map[string]bool) (int, int64, error) {
	files, size := 0, int64(0)
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if skip[filepath.ToSlash(rel)] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type().IsRegular() {
			info, err := d.Info()
			if err != nil {
				return err
			}
			files++
			size += info.Size()
		}
		return nil
	})
	return files, size, err
}

// holdsSkipped reports whether a skipped entry lies under the folder rel.
func holdsSkipped(rel string, skip map[string]bool) bool {
	for s := range skip {
		if strings.HasPrefix(s, rel+"/") {
			return true
		}
	}
	return false
}

// copyWorkers is how many cp processes cpParallel runs at once.
const copyWorkers = 4

// cp copies from to to with cp(1): recursively, links as links, each new
// file and folder with its source's mode less the umask (initdb makes them
// 0600 and 0700), and no holes (every byte is written).
func cp(ctx context.Context, from, to string) error {
	cmd := osexec.CommandContext(ctx, cpPath(), "-R", "--no-target-directory", "--no-dereference", "--sparse=never", "--", from, to)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("cp %s %s: %v: %s", from, to, err, strings.TrimSpace(out.String()))
	}
	return nil
}

// cpPath is cp from PATH, or /bin/cp when the agent runs without a PATH
// that has it (coreutils is part of every Debian system).
func cpPath() string {
	if p, err := osexec.LookPath("cp"); err == nil {
		return p
	}
	return "/bin/cp"
}
