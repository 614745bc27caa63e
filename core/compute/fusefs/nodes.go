package fusefs

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/sdk/pg"
)

// dirNode is a folder of PGDATA (the root included). Its entries live in the
// go-fuse inode tree (persistent inodes, loaded at mount); the folder itself
// is stored in the Backend (or the local store for KindLocal folders).
type dirNode struct {
	fs.Inode
	fsys   *FS
	pathMu sync.RWMutex
	path   string // changes only by a rename of the folder (renameDir)
	mode   atomic.Uint32
}

// getPath returns the folder's path relative to PGDATA.
func (d *dirNode) getPath() string {
	d.pathMu.RLock()
	defer d.pathMu.RUnlock()
	return d.path
}

var (
	_ fs.NodeGetattrer = (*dirNode)(nil)
	_ fs.NodeSetattrer = (*dirNode)(nil)
	_ fs.NodeCreater   = (*dirNode)(nil)
	_ fs.NodeMkdirer   = (*dirNode)(nil)
	_ fs.NodeUnlinker  = (*dirNode)(nil)
	_ fs.NodeRmdirer   = (*dirNode)(nil)
	_ fs.NodeRenamer   = (*dirNode)(nil)
	_ fs.NodeFsyncer   = (*dirNode)(nil)
	_ fs.NodeStatfser  = (*dirNode)(nil)
	_ fs.NodeSymlinker = (*dirNode)(nil)
)

func (d *dirNode) perm() uint32 {
	if d.getPath() == "" {
		return d.fsys.rootMode.Load()
	}
	if m := d.mode.Load(); m != 0 {
		return m & 0o7777
	}
	return 0o700
}

func (d *dirNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fsys.attr(&out.Attr, syscall.S_IFDIR|d.perm(), 4096)
	out.Nlink = 2
	return 0
}

func (d *dirNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if m, ok := in.GetMode(); ok {
		// Postgres wants PGDATA at 0700 or 0750; keep the bits in memory.
		if d.getPath() == "" {
			d.fsys.rootMode.Store(m & 0o7777)
		} else {
			d.mode.Store(m & 0o7777)
		}
	}
	return d.Getattr(ctx, fh, out)
}

func (d *dirNode) Statfs(_ context.Context, out *fuse.StatfsOut) syscall.Errno {
	out.Bsize, out.Frsize = pg.BlockSize, pg.BlockSize
	out.Blocks, out.Bfree, out.Bavail = 1<<40, 1<<39, 1<<39
	out.Files, out.Ffree = 1<<32, 1<<31
	out.NameLen = 255
	return 0
}

func (d *dirNode) Fsync(ctx context.Context, _ fs.FileHandle, _ uint32) syscall.Errno {
	return d.fsys.sync(ctx, relpath.KindOther, d.getPath())
}

func (d *dirNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	f := d.fsys
	p := join(d.getPath(), name)
	if ch := d.GetChild(name); ch != nil {
		if flags&syscall.O_EXCL != 0 {
			return nil, nil, 0, syscall.EEXIST
		}
		op, ok := ch.Operations().(fs.NodeOpener)
		if !ok {
			return nil, nil, 0, syscall.EISDIR
		}
		fh, ff, e := op.Open(ctx, flags)
		if e == 0 {
			var ao fuse.AttrOut
			ch.Operations().(fs.NodeGetattrer).Getattr(ctx, fh, &ao)
			out.Attr = ao.Attr
		}
		return ch, fh, ff, e
	}
	w := f.wal.Current()
	k := relpath.Classify(p)
	var node fs.InodeEmbedder
	switch k {
	case relpath.KindWAL:
		return nil, nil, 0, syscall.EPERM // a file named pg_wal at the root
	case relpath.KindRel:
		seg, _ := relpath.ParseRel(p)
		st := f.rel(seg.Rel)
		st.mu.Lock()
		if !st.exists {
			st.gen.Add(1)
			if err := f.be.CreateRel(ctx, seg.Rel, w); err != nil {
				st.mu.Unlock()
				return nil, nil, 0, f.fail("create", p, err)
			}
			st.exists, st.nblocks = true, 0
			if f.cache != nil {
				f.cache.Forget(seg.Rel, 0)
			}
			f.ra.forgetFork(seg.Rel, 0)
		}
		n := &relNode{fsys: f, seg: seg, st: st}
		st.segs[seg.No] = n
		st.mu.Unlock()
		node = n
	default:
		store := f.storeFor(k)
		if err := store.CreateFile(ctx, p, mode&0o7777, w); err != nil {
			return nil, nil, 0, f.fail("create", p, err)
		}
		node = &fileNode{fsys: f, path: p, store: store, kind: k, mode: mode & 0o7777}
	}
	ch := d.NewPersistentInode(ctx, node, fs.StableAttr{Mode: syscall.S_IFREG})
	var ao fuse.AttrOut
	node.(fs.NodeGetattrer).Getattr(ctx, nil, &ao)
	out.Attr = ao.Attr
	return ch, nil, fuse.FOPEN_DIRECT_IO, 0
}

func (d *dirNode) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := d.fsys
	p := join(d.getPath(), name)
	if d.GetChild(name) != nil {
		return nil, syscall.EEXIST
	}
	k := relpath.Classify(p)
	store := f.storeFor(k)
	if k == relpath.KindWAL {
		store = f.be // the folder's existence is durable, its files are scratch
	}
	if err := store.Mkdir(ctx, p, mode&0o7777, f.wal.Current()); err != nil {
		return nil, f.fail("mkdir", p, err)
	}
	if p == "pg_wal" && f.opts.WALLink {
		f.log.Error().Str("scratch", f.opts.WALScratch).Msg("mkdir pg_wal refused: pg_wal is a link to local scratch here (initdb needs -X)")
		return nil, syscall.EPERM
	}
	if p == "pg_wal" {
		ch, err := f.walRoot(ctx, d.EmbeddedInode())
		if err != nil {
			return nil, f.fail("mkdir", p, err)
		}
		f.attr(&out.Attr, syscall.S_IFDIR|0o700, 4096)
		return ch, 0
	}
	n := &dirNode{fsys: f, path: p}
	n.mode.Store(mode & 0o7777)
	var ao fuse.AttrOut
	n.Getattr(ctx, nil, &ao)
	out.Attr = ao.Attr
	ch := d.NewPersistentInode(ctx, n, fs.StableAttr{Mode: syscall.S_IFDIR})
	if d.getPath() == "base" && f.opts.OnDatabaseDir != nil {
		if oid, err := strconv.ParseUint(name, 10, 32); err == nil {
			f.opts.OnDatabaseDir(uint32(oid))
		}
	}
	return ch, 0
}

// Symlink makes pg_wal (WALLink mode, for initdb -X): the only link the
// mount holds. Postgres' other links (tablespaces in pg_tblspc) are not
// supported.
func (d *dirNode) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	f := d.fsys
	p := join(d.getPath(), name)
	if p != "pg_wal" || !f.opts.WALLink {
		f.log.Error().Str("path", p).Str("target", target).Msg("symbolic links are not supported in PGDATA (tablespaces: no)")
		return nil, syscall.EPERM
	}
	if filepath.Clean(target) != filepath.Clean(f.opts.WALScratch) {
		f.log.Error().Str("target", target).Str("scratch", f.opts.WALScratch).Msg("pg_wal may only link to the mount's WAL scratch folder")
		return nil, syscall.EPERM
	}
	if d.GetChild(name) != nil {
		return nil, syscall.EEXIST
	}
	// The folder's existence is durable (so the next mount makes the link
	// again); its files are scratch.
	if err := f.be.Mkdir(ctx, p, 0o700, f.wal.Current()); err != nil {
		return nil, f.fail("symlink", p, err)
	}
	ch, err := f.walRoot(ctx, d.EmbeddedInode())
	if err != nil {
		return nil, f.fail("symlink", p, err)
	}
	out.Attr = ch.Operations().(*fs.MemSymlink).Attr
	return ch, 0
}

func (d *dirNode) Unlink(ctx context.Context, name string) syscall.Errno {
	f := d.fsys
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	w := f.wal.Current()
	switch n := ch.Operations().(type) {
	case *relNode:
		return n.unlink(ctx, w)
	case *fileNode:
		n.mu.Lock()
		defer n.mu.Unlock()
		if err := n.store.Remove(ctx, n.path, w); err != nil {
			return f.fail("unlink", n.path, err)
		}
		n.removed = true
		return 0
	case *fs.MemSymlink:
		return syscall.EBUSY // pg_wal stays
	}
	return syscall.EISDIR
}

func (d *dirNode) Rmdir(ctx context.Context, name string) syscall.Errno {
	f := d.fsys
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	n, ok := ch.Operations().(*dirNode)
	if !ok {
		return syscall.EBUSY // pg_wal stays
	}
	if len(ch.Children()) > 0 {
		return syscall.ENOTEMPTY
	}
	np := n.getPath()
	store := f.storeFor(relpath.Classify(np))
	if err := store.Remove(ctx, np, f.wal.Current()); err != nil {
		return f.fail("rmdir", np, err)
	}
	return 0
}

// Rename moves ordinary files (Postgres' write-temp-then-rename pattern)
// and folders that hold only ordinary files (a replication slot is created
// as pg_replslot/<name>.tmp and renamed). Relation files and other folders
// answer EXDEV, as across filesystems: Postgres never renames them, and mv
// falls back to copy and delete.
func (d *dirNode) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	f := d.fsys
	if flags&^uint32(renameNoReplace) != 0 {
		return syscall.EINVAL
	}
	ch := d.GetChild(name)
	if ch == nil {
		return syscall.ENOENT
	}
	nd, ok := newParent.(*dirNode)
	if !ok {
		return syscall.EXDEV
	}
	if sd, ok := ch.Operations().(*dirNode); ok {
		return d.renameDir(ctx, sd, nd, newName, flags)
	}
	src, ok := ch.Operations().(*fileNode)
	if !ok {
		return syscall.EXDEV
	}
	to := join(nd.getPath(), newName)
	if old := nd.GetChild(newName); old != nil {
		if flags&renameNoReplace != 0 {
			return syscall.EEXIST
		}
		if old == ch {
			return 0
		}
		on, ok := old.Operations().(*fileNode)
		if !ok {
			return syscall.EXDEV
		}
		on.mu.Lock()
		defer on.mu.Unlock()
		if on.store != f.storeFor(relpath.Classify(to)) {
			return syscall.EXDEV
		}
		defer func() { on.removed = true }()
	}
	k := relpath.Classify(to)
	if k == relpath.KindRel || k == relpath.KindWAL {
		return syscall.EXDEV
	}
	w := f.wal.Current()
	src.mu.Lock()
	defer src.mu.Unlock()
	dst := f.storeFor(k)
	var err error
	if dst == src.store {
		err = dst.Rename(ctx, src.path, to, w)
	} else {
		err = f.copyAcross(ctx, src.store, src.path, src.size, dst, to, w)
	}
	if err != nil {
		return f.fail("rename", src.path, err)
	}
	src.path, src.store, src.kind = to, dst, k
	return 0
}

// renameDir moves folder sd (holding only ordinary files) to
// nd/newName: the new folder is created, each file renamed into it, and the
// old folder removed, all at the current W. It is not atomic in storage: a
// crash in between leaves both folders, the files in one of them or split
// (Postgres removes a leftover <slot>.tmp folder at start; the next mount
// removes a slot folder left without its state file, repairSlotFolders). A
// target that exists must be an empty folder (replaced unless
// RENAME_NOREPLACE).
func (d *dirNode) renameDir(ctx context.Context, sd, nd *dirNode, newName string, flags uint32) syscall.Errno {
	f := d.fsys
	from := sd.getPath()
	to := join(nd.getPath(), newName)
	if from == "" || from == "pg_wal" || strings.HasPrefix(to+"/", from+"/") {
		return syscall.EINVAL
	}
	k := relpath.Classify(to)
	store := f.storeFor(k)
	if k == relpath.KindRel || k == relpath.KindWAL || store != f.storeFor(relpath.Classify(from)) {
		return syscall.EXDEV
	}
	var files []*fileNode
	for _, c := range sd.Children() {
		fn, ok := c.Operations().(*fileNode)
		if !ok {
			return syscall.EXDEV // subfolders and relation files stay put
		}
		files = append(files, fn)
	}
	w := f.wal.Current()
	if old := nd.GetChild(newName); old != nil {
		od, ok := old.Operations().(*dirNode)
		switch {
		case flags&renameNoReplace != 0:
			return syscall.EEXIST
		case !ok:
			return syscall.ENOTDIR
		case len(old.Children()) > 0:
			return syscall.ENOTEMPTY
		}
		if err := store.Remove(ctx, od.getPath(), w); err != nil {
			return f.fail("rename", to, err)
		}
	}
	mode := sd.perm()
	if err := store.Mkdir(ctx, to, mode, w); err != nil {
		return f.fail("rename", to, err)
	}
	for _, fn := range files {
		fn.mu.Lock()
		dst := join(to, baseOf(fn.path))
		var err error
		if !fn.removed {
			err = fn.store.Rename(ctx, fn.path, dst, w)
		}
		if err == nil {
			fn.path = dst
		}
		fn.mu.Unlock()
		if err != nil {
			return f.fail("rename", from, err)
		}
	}
	if err := store.Remove(ctx, from, w); err != nil {
		return f.fail("rename", from, err)
	}
	sd.pathMu.Lock()
	sd.path = to
	sd.pathMu.Unlock()
	return 0
}

// renameNoReplace is RENAME_NOREPLACE of renameat2(2).
const renameNoReplace = 0x1

// fileNode is an ordinary file, stored whole in a Backend.
type fileNode struct {
	fs.Inode
	fsys    *FS
	mu      sync.RWMutex
	path    string
	store   Backend
	kind    relpath.Kind
	size    int64
	mode    uint32
	removed bool // unlinked or replaced; open handles read what they can
}

var (
	_ fs.NodeGetattrer = (*fileNode)(nil)
	_ fs.NodeSetattrer = (*fileNode)(nil)
	_ fs.NodeOpener    = (*fileNode)(nil)
	_ fs.NodeReader    = (*fileNode)(nil)
	_ fs.NodeWriter    = (*fileNode)(nil)
	_ fs.NodeFsyncer   = (*fileNode)(nil)
	_ fs.NodeFlusher   = (*fileNode)(nil)
)

func (n *fileNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.mu.RLock()
	defer n.mu.RUnlock()
	mode := n.mode
	if mode == 0 {
		mode = 0o600
	}
	n.fsys.attr(&out.Attr, syscall.S_IFREG|mode, n.size)
	return 0
}

func (n *fileNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		if e := n.truncate(ctx, 0); e != 0 {
			return nil, 0, e
		}
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (n *fileNode) truncate(ctx context.Context, size int64) syscall.Errno {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.removed {
		n.size = size
		return 0
	}
	if err := n.store.TruncateFile(ctx, n.path, size, n.fsys.wal.Current()); err != nil {
		return n.fsys.fail("truncate", n.path, err)
	}
	n.size = size
	return 0
}

func (n *fileNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if e := n.truncate(ctx, int64(sz)); e != 0 {
			return e
		}
	}
	if m, ok := in.GetMode(); ok {
		n.mu.Lock()
		n.mode = m & 0o7777
		n.mu.Unlock()
	}
	return n.Getattr(ctx, fh, out)
}

func (n *fileNode) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	t := time.Now()
	n.mu.RLock()
	defer n.mu.RUnlock()
	if n.removed {
		return fuse.ReadResultData(nil), 0
	}
	got, err := n.store.ReadFile(ctx, n.path, off, dest)
	if err != nil {
		return nil, n.fsys.fail("read", n.path, err)
	}
	n.fsys.waits.Observe(OpRead, n.kind, got, time.Since(t))
	return fuse.ReadResultData(dest[:got]), 0
}

func (n *fileNode) Write(ctx context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	t := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.removed {
		return 0, syscall.ESTALE
	}
	if err := n.store.WriteFile(ctx, n.path, off, data, n.fsys.wal.Current()); err != nil {
		return 0, n.fsys.fail("write", n.path, err)
	}
	if end := off + int64(len(data)); end > n.size {
		n.size = end
	}
	n.fsys.waits.Observe(OpWrite, n.kind, len(data), time.Since(t))
	return uint32(len(data)), 0
}

func (n *fileNode) Fsync(ctx context.Context, _ fs.FileHandle, _ uint32) syscall.Errno {
	n.mu.Lock()
	kind, path := n.kind, n.path
	n.mu.Unlock()
	return n.fsys.sync(ctx, kind, path)
}

func (n *fileNode) Flush(context.Context, fs.FileHandle) syscall.Errno { return 0 }

// relState is the compute's view of one relation fork: whether it exists
// and its size. The filesystem is the fork's only writer, so after load it
// is authoritative.
type relState struct {
	tag     pg.RelTag
	mu      sync.RWMutex
	exists  bool
	nblocks uint32
	segs    map[uint32]*relNode // segment files in the tree
	// gen counts the fork's mutations (writes, truncations, unlink,
	// creation), each bumped before the mutation reaches the cache tier:
	// a page read outside Postgres' own ordering (FS.Prewarm) goes into
	// the cache only if gen did not move while it was read.
	gen atomic.Uint64
}

// segSize returns the size in bytes of segment no. REQUIRES: mu held.
func (st *relState) segSize(no uint32) int64 {
	first := no * relpath.SegmentBlocks
	if st.nblocks <= first {
		return 0
	}
	return int64(min(st.nblocks-first, relpath.SegmentBlocks)) * pg.BlockSize
}

// invalidateOthers tells the kernel that sizes of the fork's other segment
// files changed (their cached attributes are stale). REQUIRES: mu held.
func (st *relState) invalidateOthers(except uint32, before uint32) {
	for no, n := range st.segs {
		if no == except {
			continue
		}
		first := no * relpath.SegmentBlocks
		old := int64(min(max(before, first)-first, relpath.SegmentBlocks))
		if old*pg.BlockSize != st.segSize(no) {
			go n.NotifyContent(-1, 0)
		}
	}
}

// relNode is a relation segment file: base/<db>/<rel>[_fork][.N].
type relNode struct {
	fs.Inode
	fsys *FS
	seg  relpath.Seg
	st   *relState
}

var (
	_ fs.NodeGetattrer = (*relNode)(nil)
	_ fs.NodeSetattrer = (*relNode)(nil)
	_ fs.NodeOpener    = (*relNode)(nil)
	_ fs.NodeReader    = (*relNode)(nil)
	_ fs.NodeWriter    = (*relNode)(nil)
	_ fs.NodeFsyncer   = (*relNode)(nil)
	_ fs.NodeFlusher   = (*relNode)(nil)
)

func (n *relNode) Getattr(_ context.Context, _ fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	n.st.mu.RLock()
	size := n.st.segSize(n.seg.No)
	n.st.mu.RUnlock()
	n.fsys.attr(&out.Attr, syscall.S_IFREG|0o600, size)
	return 0
}

func (n *relNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_TRUNC != 0 {
		if e := n.truncate(ctx, 0); e != 0 {
			return nil, 0, e
		}
	}
	return nil, fuse.FOPEN_DIRECT_IO, 0
}

func (n *relNode) Flush(context.Context, fs.FileHandle) syscall.Errno { return 0 }

func (n *relNode) Fsync(ctx context.Context, _ fs.FileHandle, _ uint32) syscall.Errno {
	return n.fsys.sync(ctx, relpath.KindRel, "")
}

func (n *relNode) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if sz, ok := in.GetSize(); ok {
		if e := n.truncate(ctx, int64(sz)); e != 0 {
			return e
		}
	}
	return n.Getattr(ctx, fh, out)
}

// truncate sets this segment's size (rounded up to whole pages): the fork
// shrinks to end inside this segment, or grows with zero pages.
func (n *relNode) truncate(ctx context.Context, size int64) syscall.Errno {
	if size > relpath.SegmentBlocks*pg.BlockSize {
		return syscall.EFBIG
	}
	st := n.st
	target := n.seg.FirstBlock() + uint32((size+pg.BlockSize-1)/pg.BlockSize)
	st.mu.Lock()
	defer st.mu.Unlock()
	if !st.exists {
		return syscall.ENOENT
	}
	if target == st.nblocks || (target > st.nblocks && size == 0) {
		return 0 // e.g. truncating an empty later segment to 0
	}
	w := n.fsys.wal.Current()
	st.gen.Add(1)
	if err := n.fsys.be.TruncateRel(ctx, st.tag, target, w); err != nil {
		return n.fsys.fail("truncate", n.seg.Path(), err)
	}
	if target < st.nblocks && n.fsys.cache != nil {
		n.fsys.cache.Forget(st.tag, target)
	}
	if target < st.nblocks {
		n.fsys.ra.forgetFork(st.tag, target)
	}
	n.fsys.lw.SetFloor(w)
	before := st.nblocks
	st.nblocks = target
	st.invalidateOthers(n.seg.No, before)
	return 0
}

func (n *relNode) unlink(ctx context.Context, w pg.LSN) syscall.Errno {
	st := n.st
	st.mu.Lock()
	defer st.mu.Unlock()
	delete(st.segs, n.seg.No)
	if !st.exists {
		return 0
	}
	st.gen.Add(1)
	before := st.nblocks
	if n.seg.No == 0 {
		if err := n.fsys.be.UnlinkRel(ctx, st.tag, w); err != nil && !errors.Is(err, ErrNotFound) {
			return n.fsys.fail("unlink", n.seg.Path(), err)
		}
		st.exists, st.nblocks = false, 0
	} else if first := n.seg.FirstBlock(); st.nblocks > first {
		if err := n.fsys.be.TruncateRel(ctx, st.tag, first, w); err != nil {
			return n.fsys.fail("unlink", n.seg.Path(), err)
		}
		st.nblocks = first
	}
	if n.fsys.cache != nil {
		n.fsys.cache.Forget(st.tag, st.nblocks)
	}
	n.fsys.ra.forgetFork(st.tag, st.nblocks)
	n.fsys.lw.SetFloor(w)
	st.invalidateOthers(n.seg.No, before)
	return 0
}

// readPage returns block blk of the fork into page: cache tier, then a
// page the read-ahead fetched, then the Backend with not_modified_since
// from the last-written-LSN map.
func (n *relNode) readPage(ctx context.Context, key pg.PageKey, page []byte) error {
	f := n.fsys
	if f.cache != nil {
		if f.cache.Get(key, page) {
			f.waits.hits.Add(1)
			return nil
		}
		f.waits.miss.Add(1)
	}
	t := time.Now()
	if p := f.ra.take(key); p != nil {
		// Waiting for a page still in flight is a GetPage wait too.
		done := p.wait(ctx)
		if d := time.Since(t); d > time.Millisecond/10 {
			f.waits.Observe(OpGetPage, relpath.KindRel, pg.BlockSize, d)
		}
		if done {
			f.waits.raUsed.Add(1)
			copy(page, p.data)
			if f.cache != nil {
				f.cache.Put(key, page)
			}
			return nil
		}
		f.waits.raDropped.Add(1)
		t = time.Now()
	}
	err := f.be.ReadPage(ctx, key, f.lw.Get(key), page)
	f.waits.Observe(OpGetPage, relpath.KindRel, pg.BlockSize, time.Since(t))
	if err != nil {
		return err
	}
	if f.cache != nil {
		f.cache.Put(key, page)
	}
	return nil
}

func (n *relNode) Read(ctx context.Context, _ fs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	t := time.Now()
	n.st.mu.RLock()
	size := n.st.segSize(n.seg.No)
	nblocks := n.st.nblocks
	n.st.mu.RUnlock()
	if off >= size {
		return fuse.ReadResultData(nil), 0
	}
	end := min(off+int64(len(dest)), size)
	dest = dest[:end-off]
	var tmp []byte
	for pos := off; pos < end; {
		blk := uint32(pos / pg.BlockSize)
		in := pos % pg.BlockSize
		key := n.st.tag.Page(n.seg.FirstBlock() + blk)
		chunk := min(int64(pg.BlockSize)-in, end-pos)
		if in == 0 && chunk == pg.BlockSize {
			if err := n.readPage(ctx, key, dest[pos-off:pos-off+pg.BlockSize]); err != nil {
				return nil, n.fsys.fail("read", n.seg.Path(), err)
			}
		} else {
			if tmp == nil {
				tmp = make([]byte, pg.BlockSize)
			}
			if err := n.readPage(ctx, key, tmp); err != nil {
				return nil, n.fsys.fail("read", n.seg.Path(), err)
			}
			copy(dest[pos-off:], tmp[in:in+chunk])
		}
		pos += chunk
	}
	last := n.seg.FirstBlock() + uint32((end-1)/pg.BlockSize)
	n.fsys.ra.observe(ctx, n.st.tag, last, nblocks)
	n.fsys.waits.Observe(OpRead, relpath.KindRel, len(dest), time.Since(t))
	return fuse.ReadResultData(dest), 0
}

// Write stores whole pages, each all-or-nothing (invariant 3). A write that
// does not cover whole pages is read-modify-written under the fork's lock
// (Postgres never does that; tools like cp may).
func (n *relNode) Write(ctx context.Context, _ fs.FileHandle, data []byte, off int64) (uint32, syscall.Errno) {
	t := time.Now()
	f := n.fsys
	if off+int64(len(data)) > relpath.SegmentBlocks*pg.BlockSize {
		return 0, syscall.EFBIG
	}
	st := n.st
	w := f.wal.Current()
	first := n.seg.FirstBlock()
	aligned := off%pg.BlockSize == 0 && len(data)%pg.BlockSize == 0
	lastBlk := first + uint32((off+int64(len(data))-1)/pg.BlockSize)
	// Extensions and partial pages take the fork's lock for writing; plain
	// overwrites of existing pages share it.
	st.mu.RLock()
	excl := !aligned || lastBlk >= st.nblocks || !st.exists
	if excl {
		st.mu.RUnlock()
		st.mu.Lock()
		defer st.mu.Unlock()
		if !st.exists {
			return 0, syscall.ENOENT
		}
	} else {
		defer st.mu.RUnlock()
	}
	st.gen.Add(1)
	var tmp []byte
	for pos := off; pos < off+int64(len(data)); {
		blk := first + uint32(pos/pg.BlockSize)
		in := pos % pg.BlockSize
		chunk := min(int64(pg.BlockSize)-in, off+int64(len(data))-pos)
		key := st.tag.Page(blk)
		page := data[pos-off : pos-off+chunk]
		if chunk != pg.BlockSize {
			if tmp == nil {
				tmp = make([]byte, pg.BlockSize)
			}
			clear(tmp)
			if blk < st.nblocks {
				if err := n.readPage(ctx, key, tmp); err != nil {
					return 0, f.fail("write", n.seg.Path(), err)
				}
			}
			copy(tmp[in:], page)
			page = tmp
		}
		// The tag is W, raised to the page's own LSN when that is higher:
		// bulk writes (index builds, RelationCopyStorage, table rewrites)
		// reach smgr before Postgres flushes their WAL, so W alone can lag.
		tag := w
		if l := PageLSN(page); l > w {
			tag = l
			f.waits.lsnAboveW.Add(1)
		}
		if err := f.be.WritePage(ctx, key, page, tag); err != nil {
			return uint32(pos - off), f.fail("write", n.seg.Path(), err)
		}
		f.lw.Set(key, tag)
		f.ra.forget(key)
		if f.cache != nil {
			f.cache.Put(key, page)
		}
		if blk >= st.nblocks {
			before := st.nblocks
			st.nblocks = blk + 1
			if before < first {
				st.invalidateOthers(n.seg.No, before)
			}
		}
		pos += chunk
	}
	f.waits.Observe(OpWrite, relpath.KindRel, len(data), time.Since(t))
	return uint32(len(data)), 0
}

// walNode is a node under pg_wal: a loopback onto local scratch whose open
// files report writes to the W tracker.
type walNode struct {
	fs.LoopbackNode
	fsys *FS
}

var (
	_ fs.NodeOpener  = (*walNode)(nil)
	_ fs.NodeCreater = (*walNode)(nil)
)

// pg_wal files are opened with direct I/O: every read and write goes to the
// scratch file, none through the kernel's page cache of the mount. With the
// page cache, the crash tests found WAL pages that the walsenders had
// streamed with a run of zeros in the middle (1,312 bytes, the same on all
// three safekeepers, valid records after it back-linked into the hole): a
// crash recovery from that WAL stops at the hole and drops every commit
// after it. Our reading is a stale cached page (the kernel drops a FUSE
// file's cached pages when its attributes change, which races with
// write-through writes of a WAL page that backends rewrite as it fills);
// direct I/O leaves nothing to go stale.
const walOpenFlags = fuse.FOPEN_DIRECT_IO

func (n *walNode) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	fh, ff, e := n.LoopbackNode.Open(ctx, flags)
	if e != 0 {
		return fh, ff, e
	}
	return n.wrap(fh, &n.Inode), ff | walOpenFlags, 0
}

func (n *walNode) Create(ctx context.Context, name string, flags uint32, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	ch, fh, ff, e := n.LoopbackNode.Create(ctx, name, flags, mode, out)
	if e != 0 {
		return ch, fh, ff, e
	}
	return ch, n.wrap(fh, ch), ff | walOpenFlags, 0
}

func (n *walNode) wrap(fh fs.FileHandle, ino *fs.Inode) fs.FileHandle {
	lf, ok := fh.(*fs.LoopbackFile)
	if !ok {
		return fh
	}
	return &walFile{LoopbackFile: lf, fsys: n.fsys, ino: ino}
}

// walFile is an open pg_wal file.
type walFile struct {
	*fs.LoopbackFile
	fsys *FS
	ino  *fs.Inode
}

var _ fs.FileWriter = (*walFile)(nil)

func (w *walFile) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	t := time.Now()
	n, e := w.LoopbackFile.Write(ctx, data, off)
	if n > 0 {
		// The name at write time: segments are created as xlogtemp.N and
		// renamed, and old ones are recycled under new names. W moves to
		// the end of the last complete record written (walpos.WroteData),
		// not to the end of the zero-padded page.
		w.fsys.wal.WroteData(filepath.Base(w.ino.Path(nil)), off, data[:n])
	}
	w.fsys.waits.Observe(OpWrite, relpath.KindWAL, int(n), time.Since(t))
	return n, e
}

var _ fs.FileFsyncer = (*walFile)(nil)

// Fsync of a pg_wal file does not flush the scratch disk. pg_wal is scratch
// (DESIGN.md section 3): WAL is durable once a quorum of safekeepers has
// flushed it, which synchronous replication waits for before any commit is
// acknowledged, and a start after a crash of the agent or the machine
// refills pg_wal from the safekeepers (FillWAL removes the local segments);
// after a Postgres crash alone the bytes are still in the kernel's cache
// of the scratch file. A disk flush here would put a local fsync on every
// commit's path for nothing. Counted as walSyncs.
func (w *walFile) Fsync(context.Context, uint32) syscall.Errno {
	w.fsys.waits.walSyncs.Add(1)
	return 0
}

// PassthroughFd refuses kernel passthrough: every WAL write must reach Write
// so that W moves.
func (w *walFile) PassthroughFd() (int, bool) { return -1, false }

// PageLSN returns pd_lsn, the first 8 bytes of a Postgres page header
// (xlogid, xrecoff; native byte order, little-endian on the platforms strata
// runs on).
func PageLSN(page []byte) pg.LSN {
	return pg.LSN(uint64(binary.LittleEndian.Uint32(page[0:4]))<<32 | uint64(binary.LittleEndian.Uint32(page[4:8])))
}
