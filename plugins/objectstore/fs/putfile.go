package fs

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sync/atomic"

	"github.com/stratadb/strata/sdk/objectstore"
)

// linkSeq names the links PutFile makes in the temporary area (which is this
// Store's own, so a counter is unique there).
var linkSeq atomic.Uint64

// PutFile implements objectstore.FilePutter: when src is on the root's
// filesystem the object becomes a hard link to it, so no byte is copied
// (the pageserver uploads every layer file it writes; with a copy, the
// default one-machine cluster wrote each layer twice). The link is made in
// the temporary area, fsynced, and moved into place like a Put's file. On
// another filesystem, or one without hard links, it copies like Put.
//
// REQUIRES (objectstore.FilePutter): src is never modified again. Object
// and file then share their bytes: a later write to src would change the
// object, and a damaged sector damages both.
func (s *Store) PutFile(ctx context.Context, key, src string, opts objectstore.PutOptions) (err error) {
	path, err := s.check(ctx, key)
	if err != nil {
		return err
	}
	tmpName := filepath.Join(s.tmp.dir, fmt.Sprintf("link-%d", linkSeq.Add(1)))
	if err := os.Link(src, tmpName); err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			return fmt.Errorf("fs: put %q from %s: %w", key, src, err)
		}
		// EXDEV (another filesystem), EPERM or EMLINK: copy instead.
		f, oerr := os.Open(src)
		if oerr != nil {
			return fmt.Errorf("fs: put %q from %s: %w", key, src, oerr)
		}
		defer f.Close()
		return s.Put(ctx, key, f, opts)
	}
	placed := false
	defer func() {
		if !placed {
			os.Remove(tmpName)
		}
	}()
	f, err := os.Open(tmpName)
	if err != nil {
		return fmt.Errorf("fs: put %q: %w", key, err)
	}
	st, err := f.Stat()
	if err == nil && opts.Size >= 0 && st.Size() != opts.Size {
		err = fmt.Errorf("fs: put %q: %s has %d bytes, PutOptions.Size said %d", key, src, st.Size(), opts.Size)
	}
	if err == nil {
		err = f.Chmod(0o644) // objects are as readable as their directories
	}
	if err == nil && !s.cfg.NoSync {
		// The file's bytes and the new link: both must survive a crash
		// before the object counts as stored.
		if serr := f.Sync(); serr != nil {
			err = fmt.Errorf("fs: put %q: fsync %s: %w", key, tmpName, serr)
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return objectstore.ErrClosed
	}
	created, err := s.place(tmpName, path, opts.IfNotExists)
	placed = err == nil && !opts.IfNotExists
	if err != nil {
		return fmt.Errorf("fs: put %q: %w", key, err)
	}
	return s.syncDirs(filepath.Dir(path), created)
}

var _ objectstore.FilePutter = (*Store)(nil)
