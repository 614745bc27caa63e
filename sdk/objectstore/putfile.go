package objectstore

import (
	"context"
	"fmt"
	"os"
	"time"
)

// FilePutter is implemented by stores that can store an object straight
// from a local file, without copying its bytes: the fs store hard-links the
// file when the store is on the same filesystem. The wrappers of this
// package implement it by passing the call down (see PutFile), so a wrapped
// store keeps the ability of the store it wraps.
type FilePutter interface {
	// PutFile stores the file at path as key, with Put's semantics
	// (opts.Size, opts.IfNotExists). REQUIRES: the file is never modified
	// again; it may be renamed or removed (the object stays).
	PutFile(ctx context.Context, key, path string, opts PutOptions) error
}

// PutFile stores the file at path as key: with s.PutFile when s implements
// FilePutter, otherwise by reading the file into Put. The file must never
// be modified again (a layer file, say); a file that changes later (a WAL
// segment being written) goes through Put.
func PutFile(ctx context.Context, s Store, key, path string, opts PutOptions) error {
	if fp, ok := s.(FilePutter); ok {
		return fp.PutFile(ctx, key, path, opts)
	}
	return putFileCopy(ctx, s, key, path, opts)
}

func putFileCopy(ctx context.Context, s Store, key, path string, opts PutOptions) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("objectstore: put %q from %s: %w", key, path, err)
	}
	defer f.Close()
	return s.Put(ctx, key, f, opts)
}

// PutFile implements FilePutter: each attempt stores the file again.
func (rs *retryStore) PutFile(ctx context.Context, key, path string, opts PutOptions) error {
	return rs.do(ctx, "put", key, nil, func() error { return PutFile(ctx, rs.s, key, path, opts) })
}

// PutFile implements FilePutter; the bytes counted are the file's size.
func (ms *metricsStore) PutFile(ctx context.Context, key, path string, opts PutOptions) error {
	start := time.Now()
	err := PutFile(ctx, ms.s, key, path, opts)
	ms.observe("put", start, err)
	if err == nil {
		if st, serr := os.Stat(path); serr == nil {
			ms.m.written.Add(float64(st.Size()))
		}
	}
	return err
}

// PutFile implements FilePutter.
func (p *prefixStore) PutFile(ctx context.Context, key, path string, opts PutOptions) error {
	k, err := p.full(key)
	if err != nil {
		return err
	}
	return PutFile(ctx, p.s, k, path, opts)
}

var (
	_ FilePutter = (*retryStore)(nil)
	_ FilePutter = (*metricsStore)(nil)
	_ FilePutter = (*prefixStore)(nil)
)
