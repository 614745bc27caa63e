package fusefs

import (
	"context"
	"errors"

	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors of a Backend.
var (
	// ErrNotFound: the relation fork, file or folder does not exist.
	ErrNotFound = errors.New("fusefs: not found")
	// ErrExists: Mkdir or CreateFile of a path that exists.
	ErrExists = errors.New("fusefs: already exists")
	// ErrNotEmpty: Remove of a folder that still holds entries.
	ErrNotEmpty = errors.New("fusefs: folder not empty")
)

// RelInfo describes a stored relation fork.
type RelInfo struct {
	Rel     pg.RelTag
	Nblocks uint32
}

// FileInfo describes a stored file or folder (not relation forks).
type FileInfo struct {
	// Path is relative to PGDATA, slash-separated ("pg_xact/0000").
	Path string
	Dir  bool
	Mode uint32 // permission bits
	Size int64
}

// Backend is the storage the compute's filesystem serves PGDATA from: page
// storage for relation forks and whole-file storage for everything else.
// psbackend (writeback mode) and redobackend (redo mode) implement it on the
// pageserver in production; Memory and LocalDir are the reference
// implementations.
//
// Every mutation carries w, the compute's WAL position (walpos.Tracker) when
// the write reached the agent. A writeback implementation must not make the
// version durable in storage before the safekeeper quorum holds WAL up to w
// (DESIGN.md invariant 2); Sync(w) returns once every mutation tagged at or
// below w is durable. Reads must see every earlier mutation of this compute
// (read-your-writes), durable or not.
//
// Each call is atomic: a WritePage stores all 8 KiB or nothing, a WriteFile
// all its bytes or nothing. Implementations are safe for concurrent use; the
// filesystem serializes mutations of one relation fork or file itself.
// Slices passed in are owned by the caller and must not be retained; page
// buffers passed to ReadPage are filled in place.
type Backend interface {
	// ListRels returns every existing relation fork and its size.
	ListRels(ctx context.Context) ([]RelInfo, error)
	// CreateRel creates an empty relation fork; an existing fork is reset to
	// zero blocks (relfilenode reuse).
	CreateRel(ctx context.Context, rel pg.RelTag, w pg.LSN) error
	// Nblocks returns the size of a relation fork in blocks, or ErrNotFound.
	Nblocks(ctx context.Context, rel pg.RelTag) (uint32, error)
	// ReadPage fills page (pg.BlockSize bytes) with the latest version of a
	// block below Nblocks. notModifiedSince comes from the last-written-LSN
	// map: the page has not changed after it, so a pageserver need not wait
	// for newer WAL. A block inside the fork that was never written reads as
	// zeros. A block at or past Nblocks is ErrNotFound.
	ReadPage(ctx context.Context, key pg.PageKey, notModifiedSince pg.LSN, page []byte) error
	// WritePage stores a page version; writing at or past the end extends
	// the fork (blocks in between read as zeros). The fork must exist.
	WritePage(ctx context.Context, key pg.PageKey, page []byte, w pg.LSN) error
	// TruncateRel sets the fork's size to nblocks, dropping or zero-extending.
	TruncateRel(ctx context.Context, rel pg.RelTag, nblocks uint32, w pg.LSN) error
	// UnlinkRel deletes the fork and its pages.
	UnlinkRel(ctx context.Context, rel pg.RelTag, w pg.LSN) error

	// List returns every stored file and folder, parents before children.
	List(ctx context.Context) ([]FileInfo, error)
	// Mkdir creates a folder; its parent must exist.
	Mkdir(ctx context.Context, path string, mode uint32, w pg.LSN) error
	// CreateFile creates an empty file, or ErrExists.
	CreateFile(ctx context.Context, path string, mode uint32, w pg.LSN) error
	// ReadFile reads up to len(buf) bytes at off and returns how many it
	// read (fewer at the end of the file; 0 at or past it).
	ReadFile(ctx context.Context, path string, off int64, buf []byte) (int, error)
	// WriteFile writes data at off, extending the file as needed.
	WriteFile(ctx context.Context, path string, off int64, data []byte, w pg.LSN) error
	// TruncateFile sets the file's size.
	TruncateFile(ctx context.Context, path string, size int64, w pg.LSN) error
	// Rename moves a file to a new path, replacing any file there.
	Rename(ctx context.Context, from, to string, w pg.LSN) error
	// Remove deletes a file or an empty folder (ErrNotEmpty otherwise).
	Remove(ctx context.Context, path string, w pg.LSN) error

	// Sync waits until every mutation tagged at or below w is durable.
	Sync(ctx context.Context, w pg.LSN) error
}

// Sender is implemented by a writeback Backend that can send every
// buffered mutation to storage without waiting for it to become durable.
// The filesystem calls Send instead of Sync while fsync must not wait for
// the safekeepers (FS.SetSyncDurable(false): Postgres' crash recovery, whose
// end-of-recovery checkpoint comes before the safekeepers can stream).
type Sender interface {
	Send(ctx context.Context) error
}

// Cache is a page cache tier in front of the Backend (the LFC). Get fills
// page and reports a hit; Put stores a copy; Forget drops the fork's blocks
// at or above from. Safe for concurrent use.
type Cache interface {
	Get(key pg.PageKey, page []byte) bool
	Put(key pg.PageKey, page []byte)
	Forget(rel pg.RelTag, from uint32)
}
