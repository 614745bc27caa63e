package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/stratadb/strata/sdk/pg"
)

// LocalDir is a Backend on a local folder, for tests and single-machine
// experiments: relation forks are files under rels/ named
// "<spc>_<db>_<rel>_<fork>" (block N at offset N*8192), other files and
// folders mirror PGDATA under files/. Sync fsyncs every file written since
// the previous Sync. It is not crash-atomic per page (a torn pwrite is
// possible on power loss); it ignores w.
type LocalDir struct {
	root string
	mu   sync.RWMutex // page writes exclusive, page reads shared: all-or-nothing for readers
	dmu  sync.Mutex
	dirt map[string]struct{}
}

var _ Backend = (*LocalDir)(nil)

// NewLocalDir opens (creating if needed) a LocalDir backend in dir.
func NewLocalDir(dir string) (*LocalDir, error) {
	for _, d := range []string{"rels", "files"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("fusefs: %w", err)
		}
	}
	return &LocalDir{root: dir, dirt: map[string]struct{}{}}, nil
}

func (l *LocalDir) relFile(r pg.RelTag) string {
	return filepath.Join(l.root, "rels", fmt.Sprintf("%d_%d_%d_%d", r.Spc, r.DB, r.Rel, r.Fork))
}

func (l *LocalDir) file(p string) string {
	return filepath.Join(l.root, "files", filepath.FromSlash(p))
}

func (l *LocalDir) dirty(p string) {
	l.dmu.Lock()
	l.dirt[p] = struct{}{}
	l.dmu.Unlock()
}

// lerr maps os errors to the Backend sentinels.
func lerr(err error, what string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s", ErrNotFound, what)
	case errors.Is(err, syscall.ENOTEMPTY): // before ErrExist, which matches it too
		return fmt.Errorf("%w: %s", ErrNotEmpty, what)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%w: %s", ErrExists, what)
	}
	return fmt.Errorf("fusefs: %s: %w", what, err)
}

func (l *LocalDir) ListRels(context.Context) ([]RelInfo, error) {
	ents, err := os.ReadDir(filepath.Join(l.root, "rels"))
	if err != nil {
		return nil, lerr(err, "rels")
	}
	var out []RelInfo
	for _, e := range ents {
		parts := strings.Split(e.Name(), "_")
		if len(parts) != 4 {
			continue
		}
		var v [4]uint64
		for i, s := range parts {
			if v[i], err = strconv.ParseUint(s, 10, 32); err != nil {
				return nil, fmt.Errorf("fusefs: bad relation file %s", e.Name())
			}
		}
		info, err := e.Info()
		if err != nil {
			return nil, lerr(err, e.Name())
		}
		out = append(out, RelInfo{
			Rel:     pg.RelTag{Spc: uint32(v[0]), DB: uint32(v[1]), Rel: uint32(v[2]), Fork: pg.ForkNumber(v[3])},
			Nblocks: uint32(info.Size() / pg.BlockSize),
		})
	}
	return out, nil
}

func (l *LocalDir) CreateRel(_ context.Context, rel pg.RelTag, _ pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.OpenFile(l.relFile(rel), os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return lerr(err, rel.String())
	}
	l.dirty(l.relFile(rel))
	return f.Close()
}

func (l *LocalDir) Nblocks(_ context.Context, rel pg.RelTag) (uint32, error) {
	st, err := os.Stat(l.relFile(rel))
	if err != nil {
		return 0, lerr(err, rel.String())
	}
	return uint32(st.Size() / pg.BlockSize), nil
}

func (l *LocalDir) ReadPage(_ context.Context, key pg.PageKey, _ pg.LSN, page []byte) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	f, err := os.Open(l.relFile(key.Tag()))
	if err != nil {
		return lerr(err, key.String())
	}
	defer f.Close()
	n, err := f.ReadAt(page[:pg.BlockSize], int64(key.Block)*pg.BlockSize)
	if n != pg.BlockSize {
		if err == io.EOF || err == nil {
			return fmt.Errorf("%w: %s", ErrNotFound, key)
		}
		return lerr(err, key.String())
	}
	return nil
}

func (l *LocalDir) WritePage(_ context.Context, key pg.PageKey, page []byte, _ pg.LSN) error {
	if len(page) != pg.BlockSize {
		return fmt.Errorf("fusefs: page of %d bytes", len(page))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.OpenFile(l.relFile(key.Tag()), os.O_WRONLY, 0)
	if err != nil {
		return lerr(err, key.String())
	}
	defer f.Close()
	if _, err := f.WriteAt(page, int64(key.Block)*pg.BlockSize); err != nil {
		return lerr(err, key.String())
	}
	l.dirty(l.relFile(key.Tag()))
	return nil
}

func (l *LocalDir) TruncateRel(_ context.Context, rel pg.RelTag, nblocks uint32, _ pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := os.Stat(l.relFile(rel)); err != nil {
		return lerr(err, rel.String())
	}
	l.dirty(l.relFile(rel))
	return lerr(os.Truncate(l.relFile(rel), int64(nblocks)*pg.BlockSize), rel.String())
}

func (l *LocalDir) UnlinkRel(_ context.Context, rel pg.RelTag, _ pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return lerr(os.Remove(l.relFile(rel)), rel.String())
}

func (l *LocalDir) List(context.Context) ([]FileInfo, error) {
	base := filepath.Join(l.root, "files")
	var out []FileInfo
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == base {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(base, p)
		fi := FileInfo{Path: filepath.ToSlash(rel), Dir: d.IsDir(), Mode: uint32(info.Mode().Perm())}
		if !fi.Dir {
			fi.Size = info.Size()
		}
		out = append(out, fi)
		return nil
	})
	if err != nil {
		return nil, lerr(err, "files")
	}
	sort.SliceStable(out, func(i, j int) bool {
		return strings.Count(out[i].Path, "/") < strings.Count(out[j].Path, "/")
	})
	return out, nil
}

func (l *LocalDir) Mkdir(_ context.Context, p string, mode uint32, _ pg.LSN) error {
	if mode == 0 {
		mode = 0o700
	}
	return lerr(os.Mkdir(l.file(p), os.FileMode(mode)), p)
}

func (l *LocalDir) CreateFile(_ context.Context, p string, mode uint32, _ pg.LSN) error {
	if mode == 0 {
		mode = 0o600
	}
	f, err := os.OpenFile(l.file(p), os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(mode))
	if err != nil {
		return lerr(err, p)
	}
	l.dirty(l.file(p))
	return f.Close()
}

func (l *LocalDir) regular(p string) error {
	st, err := os.Stat(l.file(p))
	if err != nil {
		return lerr(err, p)
	}
	if st.IsDir() {
		return fmt.Errorf("%w: %s is a folder", ErrNotFound, p)
	}
	return nil
}

func (l *LocalDir) ReadFile(_ context.Context, p string, off int64, buf []byte) (int, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if err := l.regular(p); err != nil {
		return 0, err
	}
	f, err := os.Open(l.file(p))
	if err != nil {
		return 0, lerr(err, p)
	}
	defer f.Close()
	n, err := f.ReadAt(buf, off)
	if err == io.EOF {
		err = nil
	}
	return n, lerr(err, p)
}

func (l *LocalDir) WriteFile(_ context.Context, p string, off int64, data []byte, _ pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, err := os.OpenFile(l.file(p), os.O_WRONLY, 0)
	if err != nil {
		return lerr(err, p)
	}
	defer f.Close()
	l.dirty(l.file(p))
	_, err = f.WriteAt(data, off)
	return lerr(err, p)
}

func (l *LocalDir) TruncateFile(_ context.Context, p string, size int64, _ pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.regular(p); err != nil {
		return err
	}
	l.dirty(l.file(p))
	return lerr(os.Truncate(l.file(p), size), p)
}

func (l *LocalDir) Rename(_ context.Context, from, to string, _ pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := l.regular(from); err != nil {
		return err
	}
	l.dirty(filepath.Dir(l.file(to)))
	return lerr(os.Rename(l.file(from), l.file(to)), from)
}

func (l *LocalDir) Remove(_ context.Context, p string, _ pg.LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dirty(filepath.Dir(l.file(p)))
	return lerr(os.Remove(l.file(p)), p)
}

// Sync fsyncs every file and folder changed since the last Sync.
func (l *LocalDir) Sync(context.Context, pg.LSN) error {
	l.dmu.Lock()
	paths := l.dirt
	l.dirt = map[string]struct{}{}
	l.dmu.Unlock()
	for p := range paths {
		f, err := os.Open(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return lerr(err, p)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return lerr(err, p)
		}
	}
	return nil
}
