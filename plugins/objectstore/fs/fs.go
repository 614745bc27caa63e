// Package fs is the local-filesystem object store: every object is a file
// under a root directory. It is the store of `strata up` (one machine, one
// folder) and of tests; it is not shared storage: several processes may use
// one root on one machine, but not over a network filesystem with weaker
// rename and link semantics.
//
// Durability: a Put writes a temporary file in Root/%tmp, fsyncs it, moves
// it into place with rename(2) (or link(2) for a conditional create, which
// fails with EEXIST for every racer but one), and fsyncs the directories it
// changed, so an object that Put acknowledged survives a crash, and a crash
// never leaves a partial object under its key. Temporary files of a crashed
// process are removed by the next New on the same root. PutFile
// (objectstore.FilePutter, putfile.go) stores an immutable file, such as a
// pageserver layer, as a hard link when it is on the root's filesystem.
//
// Layout: key "layers/t1/000001" is the file Root/layers%/t1%/000001.
// Directories carry a trailing '%' (and '%' in a key is escaped as "%25")
// so that one key can be an object and the prefix of others at once, as in
// every object store; segments longer than 240 bytes are cut into nested
// directories. paths.go has the details. Temporary files live in Root/%tmp
// and never appear in List.
//
// Config in YAML (core/config): objectstore: {type: fs, fs: {root: DIR}}.
package fs

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/internal/pacedwrite"
	"github.com/stratadb/strata/sdk/objectstore"
)

// Config configures the fs store.
type Config struct {
	// Root is the directory that holds the objects; it is created if
	// missing.
	Root string `mapstructure:"root" json:"root"`
	// NoSync skips every fsync: a crash may then lose or truncate objects.
	// For throwaway data (tests, benchmarks of the layers above) only.
	NoSync bool `mapstructure:"no_sync" json:"no_sync"`
}

// Validate checks the configuration. Its messages name the key as the
// config file spells it below objectstore ("fs.root: required").
func (c Config) Validate() error {
	if c.Root == "" {
		return errors.New("fs.root: required")
	}
	if strings.ContainsRune(c.Root, 0) {
		return fmt.Errorf("fs.root: %q contains a NUL byte", c.Root)
	}
	return nil
}

// Store is the fs object store. It is safe for concurrent use, by several
// Stores on the same root too (in one or several processes).
type Store struct {
	root string
	cfg  Config
	log  zerolog.Logger
	tmp  *tmpArea

	// dirMu keeps this Store's Deletes from removing a directory between a
	// Put's mkdir and its rename into it (Puts hold it shared). Stores in
	// other processes can still do that: Put then tries again.
	dirMu sync.RWMutex
	bufs  sync.Pool // of *[]byte copy buffers for Put

	closed atomic.Bool
}

var _ objectstore.Store = (*Store)(nil)

// New opens (creating it if needed) the store under cfg.Root and removes
// the temporary files that crashed processes left there.
func New(cfg Config, log zerolog.Logger) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("fs: root %q: %w", cfg.Root, err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("fs: creating root: %w", err)
	}
	st, err := os.Stat(root)
	if err != nil {
		return nil, fmt.Errorf("fs: root: %w", err)
	}
	if !st.IsDir() {
		return nil, fmt.Errorf("fs: root %s is not a directory", root)
	}
	log = log.With().Str("objectstore", "fs").Str("root", root).Logger()
	tmp, stale, err := openTmpArea(filepath.Join(root, tmpDirNam))
	if err != nil {
		return nil, err
	}
	if stale > 0 {
		log.Info().Int("areas", stale).Msg("removed temporary files left by a crashed process")
	}
	s := &Store{root: root, cfg: cfg, log: log, tmp: tmp}
	s.bufs.New = func() any { b := make([]byte, 128<<10); return &b }
	return s, nil
}

// Root returns the absolute root directory.
func (s *Store) Root() string { return s.root }

// Path returns the file that holds key (whether or not it exists).
func (s *Store) Path(key string) (string, error) {
	if err := objectstore.ValidateKey(key); err != nil {
		return "", err
	}
	return filepath.Join(s.root, relPath(key)), nil
}

func (s *Store) check(ctx context.Context, key string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if s.closed.Load() {
		return "", objectstore.ErrClosed
	}
	return s.Path(key)
}

// writerOnly hides os.File's ReadFrom, so that io.CopyBuffer uses our
// buffer and our context-checking reader.
type writerOnly struct{ io.Writer }

// Put implements objectstore.Store.
func (s *Store) Put(ctx context.Context, key string, r io.Reader, opts objectstore.PutOptions) (err error) {
	path, err := s.check(ctx, key)
	if err != nil {
		return err
	}
	f, err := s.tmp.create()
	if err != nil {
		return fmt.Errorf("fs: put %q: %w", key, err)
	}
	tmpName := f.Name()
	renamed := false // the temporary file became the object
	defer func() {
		if f != nil {
			f.Close()
		}
		if renamed {
			return
		}
		if rerr := os.Remove(tmpName); rerr != nil && !errors.Is(rerr, iofs.ErrNotExist) {
			s.log.Warn().Err(rerr).Str("file", tmpName).Msg("removing a temporary file")
		}
	}()

	// A synced object's writeback is paced: a large one would otherwise
	// reach the disk in one burst at its fsync (package pacedwrite).
	var dst io.Writer = writerOnly{f}
	if !s.cfg.NoSync {
		dst = pacedwrite.New(f)
	}
	bp := s.bufs.Get().(*[]byte)
	n, err := io.CopyBuffer(dst, objectstore.ContextReader(ctx, r), *bp)
	s.bufs.Put(bp)
	if err != nil {
		return fmt.Errorf("fs: put %q: writing %s: %w", key, tmpName, err)
	}
	if opts.Size >= 0 && n != opts.Size {
		return fmt.Errorf("fs: put %q: body has %d bytes, PutOptions.Size said %d", key, n, opts.Size)
	}
	// CreateTemp makes files 0600; objects are as readable as the
	// directories (0755) that hold them.
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("fs: put %q: chmod %s: %w", key, tmpName, err)
	}
	if !s.cfg.NoSync {
		if err := f.Sync(); err != nil {
			return fmt.Errorf("fs: put %q: fsync %s: %w", key, tmpName, err)
		}
	}
	err = f.Close()
	f = nil
	if err != nil {
		return fmt.Errorf("fs: put %q: closing %s: %w", key, tmpName, err)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return objectstore.ErrClosed
	}

	dir := filepath.Dir(path)
	created, err := s.place(tmpName, path, opts.IfNotExists)
	renamed = err == nil && !opts.IfNotExists
	if err != nil {
		return fmt.Errorf("fs: put %q: %w", key, err)
	}
	return s.syncDirs(dir, created)
}

// place moves (or, for a conditional create, links) the temporary file
// into place, creating the directories it needs, and returns those. A
// Delete in another process may remove the directories we create before we
// fill them: then it tries again.
func (s *Store) place(tmpName, path string, ifNotExists bool) ([]string, error) {
	dir := filepath.Dir(path)
	var created []string
	s.dirMu.RLock()
	defer s.dirMu.RUnlock()
	for attempt := 0; ; attempt++ {
		c, err := s.mkdirs(dir)
		created = append(created, c...)
		if err != nil {
			if errors.Is(err, iofs.ErrNotExist) && attempt < 100 {
				continue // a parent was removed meanwhile
			}
			return created, err
		}
		if ifNotExists {
			err = os.Link(tmpName, path)
			if errors.Is(err, iofs.ErrExist) {
				return created, fmt.Errorf("%s: %w", path, objectstore.ErrExists)
			}
		} else {
			err = os.Rename(tmpName, path)
		}
		if err == nil {
			return created, nil
		}
		if !errors.Is(err, iofs.ErrNotExist) || attempt >= 100 {
			return created, fmt.Errorf("moving %s into place: %w", tmpName, err)
		}
	}
}

// mkdirs creates dir and its missing parents and returns the ones it
// created, outermost first.
func (s *Store) mkdirs(dir string) ([]string, error) {
	var missing []string
	for d := dir; d != s.root; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		} else if !errors.Is(err, iofs.ErrNotExist) {
			return nil, err
		}
		missing = append(missing, d)
	}
	var created []string
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], 0o755)
		if err == nil {
			created = append(created, missing[i])
		} else if !errors.Is(err, iofs.ErrExist) {
			return created, err
		}
	}
	return created, nil
}

// syncDirs makes the new entry in dir and the directories created for it
// durable.
func (s *Store) syncDirs(dir string, created []string) error {
	if s.cfg.NoSync {
		return nil
	}
	dirs := map[string]bool{dir: true}
	for _, c := range created {
		dirs[c] = true
		dirs[filepath.Dir(c)] = true
	}
	for d := range dirs {
		if err := syncDir(d); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return fmt.Errorf("fs: fsync directory %s: %w", d, err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func (s *Store) open(ctx context.Context, op, key string) (*os.File, int64, error) {
	path, err := s.check(ctx, key)
	if err != nil {
		return nil, 0, err
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, 0, fmt.Errorf("fs: %s %q (%s): %w", op, key, path, objectstore.ErrNotFound)
		}
		return nil, 0, fmt.Errorf("fs: %s %q: %w", op, key, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("fs: %s %q: %w", op, key, err)
	}
	if !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, fmt.Errorf("fs: %s %q: %s is not a regular file", op, key, path)
	}
	return f, st.Size(), nil
}

// Get implements objectstore.Store.
func (s *Store) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	f, _, err := s.open(ctx, "get", key)
	if err != nil {
		return nil, err
	}
	return objectstore.ContextReadCloser(ctx, f), nil
}

// GetRange implements objectstore.Store. A negative off is ErrInvalidRange.
func (s *Store) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	f, size, err := s.open(ctx, "get range", key)
	if err != nil {
		return nil, err
	}
	if off < 0 || off > size {
		f.Close()
		return nil, fmt.Errorf("fs: get range %q: offset %d, size %d: %w", key, off, size, objectstore.ErrInvalidRange)
	}
	n := size - off
	if length >= 0 && length < n {
		n = length
	}
	return objectstore.ContextReadCloser(ctx, &sectionFile{io.NewSectionReader(f, off, n), f}), nil
}

type sectionFile struct {
	*io.SectionReader
	f *os.File
}

func (s *sectionFile) Close() error { return s.f.Close() }

// Stat implements objectstore.Store.
func (s *Store) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	path, err := s.check(ctx, key)
	if err != nil {
		return objectstore.ObjectInfo{}, err
	}
	st, err := os.Lstat(path)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return objectstore.ObjectInfo{}, fmt.Errorf("fs: stat %q (%s): %w", key, path, objectstore.ErrNotFound)
		}
		return objectstore.ObjectInfo{}, fmt.Errorf("fs: stat %q: %w", key, err)
	}
	if !st.Mode().IsRegular() {
		return objectstore.ObjectInfo{}, fmt.Errorf("fs: stat %q: %s is not a regular file", key, path)
	}
	return objectstore.ObjectInfo{Key: key, Size: st.Size(), ModTime: st.ModTime()}, nil
}

// List implements objectstore.Store. It walks the directories that can hold
// keys with the prefix, collects the matching objects, sorts them by key
// and then calls fn: its memory grows with the number of matching objects.
func (s *Store) List(ctx context.Context, prefix string, fn func(objectstore.ObjectInfo) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return objectstore.ErrClosed
	}
	if len(prefix) > objectstore.MaxKeyLen || strings.ContainsRune(prefix, 0) {
		return nil // no key can have it
	}
	rel, esc := relDir(prefix)
	var infos []objectstore.ObjectInfo
	err := s.walk(ctx, filepath.Join(s.root, rel), esc, prefix, &infos)
	if err != nil {
		return err
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key < infos[j].Key })
	for _, info := range infos {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(info); err != nil {
			return err
		}
	}
	return nil
}

// walk collects into out the objects under dir whose keys start with
// prefix; esc is the escaped key prefix that dir stands for.
func (s *Store) walk(ctx context.Context, dir, esc, prefix string, out *[]objectstore.ObjectInfo) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return nil // nothing under this prefix, or deleted while we walk
		}
		return fmt.Errorf("fs: list %q: %w", prefix, err)
	}
	for _, e := range entries {
		name := e.Name()
		if esc == "" && name == tmpDirNam {
			continue
		}
		kind, piece := classify(name)
		switch {
		case kind == kindFile && e.Type().IsRegular():
			key, ok := keyOf(esc + piece)
			if !ok || !strings.HasPrefix(key, prefix) {
				continue
			}
			info, err := e.Info()
			if errors.Is(err, iofs.ErrNotExist) {
				continue // deleted meanwhile
			} else if err != nil {
				return fmt.Errorf("fs: list %q: %w", prefix, err)
			}
			*out = append(*out, objectstore.ObjectInfo{Key: key, Size: info.Size(), ModTime: info.ModTime()})
		case kind == kindDir && e.IsDir():
			sub := esc + piece + "/"
			if k, ok := unescape(sub); !ok || !(strings.HasPrefix(k, prefix) || strings.HasPrefix(prefix, k)) {
				continue // no key below can match
			}
			if err := s.walk(ctx, filepath.Join(dir, name), sub, prefix, out); err != nil {
				return err
			}
		case kind == kindCont && e.IsDir():
			if err := s.walk(ctx, filepath.Join(dir, name), esc+piece, prefix, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// Delete implements objectstore.Store. It also removes the directories
// that the deletion leaves empty (never Root).
func (s *Store) Delete(ctx context.Context, key string) error {
	path, err := s.check(ctx, key)
	if err != nil {
		return err
	}
	err = syscall.Unlink(path)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fs: delete %q: unlink %s: %w", key, path, err)
	}
	dir := filepath.Dir(path)
	s.dirMu.Lock()
	for dir != s.root && syscall.Rmdir(dir) == nil {
		dir = filepath.Dir(dir)
	}
	s.dirMu.Unlock()
	if !s.cfg.NoSync {
		if err := syncDir(dir); err != nil && !errors.Is(err, iofs.ErrNotExist) {
			return fmt.Errorf("fs: delete %q: fsync %s: %w", key, dir, err)
		}
	}
	return nil
}

// Close implements objectstore.Store: later calls fail with
// objectstore.ErrClosed. Readers already returned keep working.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return objectstore.ErrClosed
	}
	return s.tmp.close()
}
