// Package fusefs is the compute's FUSE filesystem for PGDATA. Stock
// PostgreSQL 15 runs on it unmodified: relation segment files are served page
// by page (cache tier, then Backend.ReadPage with not_modified_since from the
// last-written-LSN map) and written page by page, all-or-nothing, with direct
// I/O so the kernel page cache holds no second copy; every other file of the
// data directory is stored whole in the Backend; pg_wal passes through to a
// local scratch folder, and each WAL write moves W (walpos), the WAL position
// that every stored version is tagged with (DESIGN.md section 3a).
//
// It is not the compute agent: starting Postgres, fetching WAL from the
// safekeepers and the pageserver client live elsewhere and plug in through
// Backend and Cache.
package fusefs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/sdk/pg"
)

// Options configure a mount.
type Options struct {
	// Backend stores PGDATA (required).
	Backend Backend
	// Cache is the page cache tier; nil means none.
	Cache Cache
	// WALScratch is the local folder that pg_wal passes through to
	// (required). It is created if missing.
	WALScratch string
	// WALLink makes pg_wal a symbolic link to WALScratch (an absolute
	// path) instead of a folder of the mount: Postgres then writes and its
	// walsenders read WAL with no FUSE round trip, and W is found by
	// walking the WAL in WALScratch (walpos.Tracker.Follow). A new cluster
	// needs initdb -X WALScratch, which makes the link (a mkdir of pg_wal
	// is refused).
	WALLink bool
	// UID and GID own every file (the postgres OS user).
	UID, GID uint32
	// WALStart is the WAL position the compute starts from (the durable end
	// of WAL it was given); W never goes below it.
	WALStart pg.LSN
	// WALSegmentSize is the WAL segment size; 0 means 16 MiB.
	WALSegmentSize uint64
	// LastWrittenMax bounds the last-written-LSN map; 0 means 1<<20 pages.
	LastWrittenMax int
	// ReadAhead is how many blocks are fetched in one batch ahead of a
	// process that reads a relation fork sequentially (a sequential scan,
	// VACUUM, an index build); 0 turns read-ahead off (readahead.go).
	ReadAhead int
	// AttrTimeout is how long the kernel may cache sizes and attributes;
	// every change goes through the kernel, so caching is safe. 0 means 1 s.
	AttrTimeout time.Duration
	// SendOnlySync starts the mount with fsync returning once every
	// mutation is sent to the Backend (Sender.Send), without waiting for
	// durability, until SetSyncDurable(true). For a compute whose Postgres
	// is in crash recovery: see SetSyncDurable.
	SendOnlySync bool
	// SendOnlyPath, when set, names paths (files and folders) whose fsync
	// always returns once sent, whatever SetSyncDurable says. The agent
	// names the safekeepers' replication slots: a safekeeper that connects
	// creates its slot, and a durable fsync of the slot would wait for a
	// quorum that needs this very safekeeper when another one is down.
	// Returning early is safe for the reason SetSyncDurable gives; a slot
	// lost in a crash is created again when its safekeeper reconnects.
	SendOnlyPath func(path string) bool
	// OnDatabaseDir, when set, is called with the OID of each database
	// folder Postgres makes (base/<oid>: CREATE DATABASE, before it
	// commits). It must not block.
	OnDatabaseDir func(oid uint32)
	// Debug logs every FUSE request.
	Debug bool
	Log   zerolog.Logger
}

// FS is a mounted PGDATA filesystem.
type FS struct {
	opts   Options
	be     Backend
	local  *Memory // KindLocal files: die with the mount
	cache  Cache
	wal    *walpos.Tracker
	lw     *LastWritten
	ra     *readAhead // nil: no read-ahead
	waits  Waits
	log    zerolog.Logger
	server *fuse.Server
	mnt    string

	relMu sync.Mutex
	rels  map[pg.RelTag]*relState

	rootMode atomic.Uint32
	started  time.Time
	sendOnly atomic.Bool // fsync sends, does not wait for durability
}

// Mount loads the tree from opts.Backend and mounts it at mountpoint (which
// must exist). Call Unmount when done.
func Mount(ctx context.Context, mountpoint string, opts Options) (*FS, error) {
	if opts.Backend == nil || opts.WALScratch == "" {
		return nil, errors.New("fusefs: Backend and WALScratch are required")
	}
	if opts.WALSegmentSize == 0 {
		opts.WALSegmentSize = pg.WALSegmentSize
	}
	if opts.LastWrittenMax == 0 {
		opts.LastWrittenMax = 1 << 20
	}
	if opts.AttrTimeout == 0 {
		opts.AttrTimeout = time.Second
	}
	f := &FS{
		opts:    opts,
		be:      opts.Backend,
		local:   &Memory{rels: map[pg.RelTag]*memRel{}, files: map[string]*memFile{}, flat: true},
		cache:   opts.Cache,
		wal:     walpos.New(opts.WALSegmentSize, opts.WALStart),
		lw:      NewLastWritten(opts.LastWrittenMax, opts.WALStart),
		log:     opts.Log,
		rels:    map[pg.RelTag]*relState{},
		started: time.Now(),
		mnt:     mountpoint,
	}
	f.ra = newReadAhead(f, opts.ReadAhead)
	if opts.WALLink {
		if !filepath.IsAbs(opts.WALScratch) {
			return nil, fmt.Errorf("fusefs: WALScratch %q must be absolute for WALLink", opts.WALScratch)
		}
		f.wal.Follow(opts.WALScratch, opts.WALStart)
		log := opts.Log
		f.wal.OnWatchRefused(func(err error) {
			log.Warn().Err(err).Str("folder", opts.WALScratch).
				Msg("fusefs: no inotify watch on pg_wal: every page write walks the WAL written since the last (correct, slower under bulk loads; see fs.inotify.max_user_instances)")
		})
	}
	f.rootMode.Store(0o700)
	f.sendOnly.Store(opts.SendOnlySync)
	root := &dirNode{fsys: f, path: ""}
	to := opts.AttrTimeout
	neg := time.Duration(0)
	fopts := &fs.Options{
		// The root's inode number is what Postgres keys its System V
		// shared memory on (PGSharedMemoryCreate: st_ino of PGDATA). Left
		// 0 it is IPC_PRIVATE: a postmaster that starts after one was
		// killed cannot find the dead one's segment, and never removes it
		// or the dynamic shared memory segments in /dev/shm it names (one
		// leaked per crash). 1 is FUSE's root node ID.
		RootStableAttr:  &fs.StableAttr{Ino: fuse.FUSE_ROOT_ID},
		EntryTimeout:    &to,
		AttrTimeout:     &to,
		NegativeTimeout: &neg,
		UID:             opts.UID,
		GID:             opts.GID,
		MountOptions: fuse.MountOptions{
			AllowOther:    true,
			DirectMount:   true,
			FsName:        "strata",
			Name:          "strata",
			MaxWrite:      1 << 20,
			DisableXAttrs: true,
			Debug:         opts.Debug,
		},
	}
	// Build the tree before the kernel sees the mount.
	var loadErr error
	fopts.OnAdd = func(context.Context) { loadErr = f.load(ctx, root) }
	server, err := fs.Mount(mountpoint, root, fopts)
	if err != nil {
		return nil, fmt.Errorf("fusefs: mount %s: %w", mountpoint, err)
	}
	f.server = server
	if err := closeFUSEOnExec(); err != nil {
		_ = f.Unmount()
		return nil, fmt.Errorf("fusefs: mark the FUSE connection close-on-exec: %w", err)
	}
	if loadErr != nil {
		_ = f.Unmount()
		return nil, fmt.Errorf("fusefs: load tree: %w", loadErr)
	}
	f.log.Info().Str("mountpoint", mountpoint).Msg("PGDATA mounted")
	return f, nil
}

// Unmount unmounts the filesystem, falling back to a lazy unmount of exactly
// this mountpoint when it is busy; it then waits for the server to stop.
func (f *FS) Unmount() error {
	var err error
	for i := 0; i < 20; i++ {
		if err = f.server.Unmount(); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		f.log.Warn().Err(err).Str("mountpoint", f.mnt).Msg("unmount busy; lazy unmount")
		if out, lerr := exec.Command("umount", "-l", f.mnt).CombinedOutput(); lerr != nil {
			return fmt.Errorf("fusefs: unmount %s: %v; umount -l: %v: %s", f.mnt, err, lerr, out)
		}
	}
	f.server.Wait()
	f.wal.Close()
	return nil
}

// Waits returns the filesystem's operation counters.
func (f *FS) Waits() *Waits { return &f.waits }

// Register adds the filesystem's counters (Waits.Collector) to reg.
func (f *FS) Register(reg *prometheus.Registry) error { return reg.Register(f.waits.Collector()) }

// WAL returns the tracker of W.
func (f *FS) WAL() *walpos.Tracker { return f.wal }

// Mountpoint returns where the filesystem is mounted.
func (f *FS) Mountpoint() string { return f.mnt }

// load builds the inode tree from the Backend.
func (f *FS) load(ctx context.Context, root *dirNode) error {
	files, err := f.be.List(ctx)
	if err != nil {
		return err
	}
	if files, err = f.repairSlotFolders(ctx, files); err != nil {
		return err
	}
	dirs := map[string]*fs.Inode{"": root.EmbeddedInode()}
	for _, fi := range files {
		parent, ok := dirs[parentOf(fi.Path)]
		if !ok {
			return fmt.Errorf("%s: parent folder missing", fi.Path)
		}
		name := baseOf(fi.Path)
		if fi.Dir {
			var ch *fs.Inode
			if fi.Path == "pg_wal" {
				ch, err = f.walRoot(ctx, parent)
				if err != nil {
					return err
				}
			} else {
				dn := &dirNode{fsys: f, path: fi.Path}
				dn.mode.Store(fi.Mode)
				ch = parent.NewPersistentInode(ctx, dn, fs.StableAttr{Mode: syscall.S_IFDIR})
			}
			parent.AddChild(name, ch, false)
			dirs[fi.Path] = ch
			continue
		}
		n := &fileNode{fsys: f, path: fi.Path, store: f.be, kind: relpath.KindOther, size: fi.Size, mode: fi.Mode}
		parent.AddChild(name, parent.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG}), false)
	}
	rels, err := f.be.ListRels(ctx)
	if err != nil {
		return err
	}
	for _, ri := range rels {
		st := f.rel(ri.Rel)
		st.exists, st.nblocks = true, ri.Nblocks
		segs := (ri.Nblocks + relpath.SegmentBlocks - 1) / relpath.SegmentBlocks
		if segs == 0 {
			segs = 1
		}
		for no := uint32(0); no < segs; no++ {
			seg := relpath.Seg{Rel: ri.Rel, No: no}
			p := seg.Path()
			parent, ok := dirs[parentOf(p)]
			if !ok {
				return fmt.Errorf("relation %s: folder %s missing", ri.Rel, parentOf(p))
			}
			n := &relNode{fsys: f, seg: seg, st: st}
			st.segs[no] = n
			parent.AddChild(baseOf(p), parent.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFREG}), false)
		}
	}
	f.log.Info().Int("files", len(files)).Int("relations", len(rels)).Msg("PGDATA tree loaded")
	return nil
}

// walRoot makes the pg_wal node: a loopback onto the scratch folder whose
// file handles report every write to the W tracker, or (WALLink) a
// symbolic link to the scratch folder.
func (f *FS) walRoot(ctx context.Context, parent *fs.Inode) (*fs.Inode, error) {
	if err := os.MkdirAll(f.opts.WALScratch, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chown(f.opts.WALScratch, int(f.opts.UID), int(f.opts.GID)); err != nil {
		return nil, err
	}
	if f.opts.WALLink {
		l := &fs.MemSymlink{Data: []byte(f.opts.WALScratch)}
		l.Attr.Mode = syscall.S_IFLNK | 0o777
		l.Attr.Size = uint64(len(l.Data))
		l.Attr.Owner = fuse.Owner{Uid: f.opts.UID, Gid: f.opts.GID}
		t := uint64(f.started.Unix())
		l.Attr.Atime, l.Attr.Mtime, l.Attr.Ctime = t, t, t
		return parent.NewPersistentInode(ctx, l, fs.StableAttr{Mode: syscall.S_IFLNK}), nil
	}
	var st syscall.Stat_t
	if err := syscall.Stat(f.opts.WALScratch, &st); err != nil {
		return nil, err
	}
	lr := &fs.LoopbackRoot{Path: f.opts.WALScratch, Dev: uint64(st.Dev)}
	lr.NewNode = func(r *fs.LoopbackRoot, _ *fs.Inode, _ string, _ *syscall.Stat_t) fs.InodeEmbedder {
		return &walNode{LoopbackNode: fs.LoopbackNode{RootData: r}, fsys: f}
	}
	rn := &walNode{LoopbackNode: fs.LoopbackNode{RootData: lr}, fsys: f}
	lr.RootNode = rn
	return parent.NewPersistentInode(ctx, rn, fs.StableAttr{Mode: syscall.S_IFDIR}), nil
}

func (f *FS) rel(tag pg.RelTag) *relState {
	f.relMu.Lock()
	defer f.relMu.Unlock()
	st, ok := f.rels[tag]
	if !ok {
		st = &relState{tag: tag, segs: map[uint32]*relNode{}}
		f.rels[tag] = st
	}
	return st
}

// storeFor returns where files of kind k live.
func (f *FS) storeFor(k relpath.Kind) Backend {
	if k == relpath.KindLocal {
		return f.local
	}
	return f.be
}

func (f *FS) attr(out *fuse.Attr, mode uint32, size int64) {
	out.Mode = mode
	out.Size = uint64(size)
	out.Blocks = (uint64(size) + 511) / 512
	out.Blksize = pg.BlockSize
	out.Owner = fuse.Owner{Uid: f.opts.UID, Gid: f.opts.GID}
	t := uint64(f.started.Unix())
	out.Atime, out.Mtime, out.Ctime = t, t, t
	out.Nlink = 1
}

func parentOf(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ""
	}
	return p[:i]
}

func baseOf(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

func join(dir, name string) string {
	if dir == "" {
		return name
	}
	return dir + "/" + name
}

// errno maps Backend errors to errnos.
func errno(err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrNotFound):
		return syscall.ENOENT
	case errors.Is(err, ErrExists):
		return syscall.EEXIST
	case errors.Is(err, ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	}
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EIO
}

func (f *FS) fail(op, path string, err error) syscall.Errno {
	e := errno(err)
	if e == syscall.EIO {
		f.log.Error().Err(err).Str("op", op).Str("path", path).Msg("backend error")
	}
	return e
}

// SetSyncDurable says whether fsync waits until every mutation up to W is
// durable (true, the normal case: DESIGN.md invariant 2 makes that wait on
// the safekeeper quorum) or only until it is sent to the Backend (false).
//
// The agent turns it off while Postgres is in crash recovery: its
// end-of-recovery checkpoint fsyncs pg_control before Postgres accepts the
// safekeepers' replication connections, so a durable fsync would wait for
// ever. Returning early is safe because durable versions always form a
// prefix by W: a version becomes durable only once the quorum holds WAL up
// to its W, and then every version with a lower W is durable too, so a
// crash leaves storage as it was at some W that the WAL on the quorum
// reaches, which crash recovery repairs (docs/design/compute-fuse.md).
// A Backend that is not a Sender falls back to Sync.
func (f *FS) SetSyncDurable(on bool) { f.sendOnly.Store(!on) }

// SyncDurable reports whether fsync waits for durability.
func (f *FS) SyncDurable() bool { return !f.sendOnly.Load() }

// sync waits until every mutation up to the current W is durable (or, see
// SetSyncDurable and Options.SendOnlyPath, sent). path is the file or
// folder fsynced.
func (f *FS) sync(ctx context.Context, k relpath.Kind, path string) syscall.Errno {
	if k == relpath.KindLocal {
		return 0
	}
	t := time.Now()
	var err error
	sendOnly := f.sendOnly.Load() || (f.opts.SendOnlyPath != nil && f.opts.SendOnlyPath(path))
	if s, ok := f.be.(Sender); ok && sendOnly {
		err = s.Send(ctx)
		f.waits.sendOnly.Add(1)
	} else {
		err = f.be.Sync(ctx, f.wal.Current())
	}
	f.waits.Observe(OpFsync, k, 0, time.Since(t))
	return f.fail("fsync", "", err)
}

// copyAcross moves a file between the durable and the local store.
func (f *FS) copyAcross(ctx context.Context, src Backend, from string, size int64, dst Backend, to string, w pg.LSN) error {
	buf := make([]byte, size)
	n, err := src.ReadFile(ctx, from, 0, buf)
	if err != nil {
		return err
	}
	if err := dst.Remove(ctx, to, w); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	if err := dst.CreateFile(ctx, to, 0o600, w); err != nil {
		return err
	}
	if err := dst.WriteFile(ctx, to, 0, buf[:n], w); err != nil {
		return err
	}
	return src.Remove(ctx, from, w)
}
