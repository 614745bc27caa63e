package fusefs

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratadb/strata/core/compute/relpath"
	"github.com/stratadb/strata/sdk/pg"
)

func page(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }

func size(t *testing.T, p string) int64 {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Size()
}

func seekEnd(t *testing.T, f *os.File) int64 {
	t.Helper()
	n, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRelationFiles(t *testing.T) {
	e := newEnv(t)
	be := NewMemory()
	fsys := e.mount(t, be, NewMemCache(64))
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(e.mnt, "base/5"), 0o700))
	p := filepath.Join(e.mnt, "base/5/16384")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	must(err)
	defer f.Close()
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	if n, err := be.Nblocks(ctx, rel); err != nil || n != 0 {
		t.Fatalf("after create: nblocks %d, %v", n, err)
	}
	if _, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600); !errors.Is(err, os.ErrExist) {
		t.Fatalf("O_EXCL on existing: %v", err)
	}
	// Extend by two pages, as mdextend does.
	for i := 0; i < 2; i++ {
		if _, err := f.WriteAt(page(byte('a'+i)), int64(i)*pg.BlockSize); err != nil {
			t.Fatal(err)
		}
	}
	if got := seekEnd(t, f); got != 2*pg.BlockSize {
		t.Fatalf("SEEK_END = %d", got)
	}
	if n, _ := be.Nblocks(ctx, rel); n != 2 {
		t.Fatalf("backend nblocks = %d", n)
	}
	buf := make([]byte, 2*pg.BlockSize)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[:pg.BlockSize], page('a')) || !bytes.Equal(buf[pg.BlockSize:], page('b')) {
		t.Fatal("read back differs")
	}
	// Reads at EOF are short; unaligned reads cross pages.
	small := make([]byte, 100)
	if n, err := f.ReadAt(small, pg.BlockSize-50); n != 100 || err != nil || !bytes.Equal(small[:50], bytes.Repeat([]byte{'a'}, 50)) || small[50] != 'b' {
		t.Fatalf("cross-page read: %d %v %q", n, err, small[45:55])
	}
	if n, err := f.ReadAt(small, 2*pg.BlockSize); n != 0 || err != io.EOF {
		t.Fatalf("read at EOF: %d %v", n, err)
	}
	// A partial-page write is read-modify-written.
	if _, err := f.WriteAt([]byte("hello"), pg.BlockSize+10); err != nil {
		t.Fatal(err)
	}
	pb := make([]byte, pg.BlockSize)
	must(be.ReadPage(ctx, rel.Page(1), 0, pb))
	if string(pb[10:15]) != "hello" || pb[9] != 'b' || pb[15] != 'b' {
		t.Fatalf("partial write stored %q", pb[5:20])
	}
	// A hole: write block 5, blocks 2..4 read as zeros.
	if _, err := f.WriteAt(page('f'), 5*pg.BlockSize); err != nil {
		t.Fatal(err)
	}
	if got := size(t, p); got != 6*pg.BlockSize {
		t.Fatalf("size after hole write = %d", got)
	}
	if _, err := f.ReadAt(pb, 3*pg.BlockSize); err != nil || !bytes.Equal(pb, make([]byte, pg.BlockSize)) {
		t.Fatalf("hole not zero: %v", err)
	}
	// Second segment: created by name, extends the fork past 1 GiB.
	p1 := p + ".1"
	f1, err := os.OpenFile(p1, os.O_RDWR|os.O_CREATE, 0o600)
	must(err)
	defer f1.Close()
	if got := seekEnd(t, f1); got != 0 {
		t.Fatalf("new segment size %d", got)
	}
	if _, err := f1.WriteAt(page('z'), 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := be.Nblocks(ctx, rel); n != relpath.SegmentBlocks+1 {
		t.Fatalf("nblocks after segment 1 = %d", n)
	}
	if got := size(t, p); got != 1<<30 {
		t.Fatalf("segment 0 size = %d; want 1 GiB", got)
	}
	// Writing past 1 GiB in one segment file is refused.
	if _, err := f.WriteAt(page('x'), 1<<30); !errors.Is(err, syscall.EFBIG) {
		t.Fatalf("write past segment: %v", err)
	}
	// Truncate like mdtruncate: last segment to 0, then segment 0 to 3 pages.
	must(f1.Truncate(0))
	must(f.Truncate(3 * pg.BlockSize))
	if n, _ := be.Nblocks(ctx, rel); n != 3 {
		t.Fatalf("nblocks after truncate = %d", n)
	}
	if got := seekEnd(t, f); got != 3*pg.BlockSize {
		t.Fatalf("SEEK_END after truncate = %d", got)
	}
	if got := size(t, p1); got != 0 {
		t.Fatalf("segment 1 size after truncate = %d", got)
	}
	must(f.Sync())
	if fsys.Waits().Count(OpFsync, relpath.KindRel) == 0 {
		t.Fatal("fsync not counted")
	}
	// Renaming relation files is refused as across devices.
	if err := os.Rename(p, p+"x"); !errors.Is(err, syscall.EXDEV) {
		t.Fatalf("rename relation: %v", err)
	}
	// Unlink: segment 1, then segment 0 drops the fork.
	must(os.Remove(p1))
	must(os.Remove(p))
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stat after unlink: %v", err)
	}
	if _, err := be.Nblocks(ctx, rel); !errors.Is(err, ErrNotFound) {
		t.Fatalf("backend after unlink: %v", err)
	}
	// The same relfilenode can be created again, empty.
	must(os.WriteFile(p, page('q'), 0o600))
	if n, _ := be.Nblocks(ctx, rel); n != 1 {
		t.Fatalf("recreated nblocks = %d", n)
	}
	if fsys.Waits().Count(OpWrite, relpath.KindRel) == 0 || fsys.Waits().Count(OpRead, relpath.KindRel) == 0 {
		t.Fatal("reads/writes not counted")
	}
	reg := prometheus.NewRegistry()
	must(fsys.Register(reg))
	mfs, err := reg.Gather()
	must(err)
	var writes float64
	for _, mf := range mfs {
		if mf.GetName() != "strata_compute_fuse_ops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["op"] == "write" && labels["kind"] == "rel" {
				writes = m.GetCounter().GetValue()
			}
		}
	}
	if writes != float64(fsys.Waits().Count(OpWrite, relpath.KindRel)) || writes < 5 {
		t.Fatalf("exported rel writes = %v; counted %d", writes, fsys.Waits().Count(OpWrite, relpath.KindRel))
	}
}

func TestOtherFilesAndWAL(t *testing.T) {
	e := newEnv(t)
	be := NewMemory()
	fsys := e.mount(t, be, nil)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// Ownership and modes: Postgres insists PGDATA is its own, 0700/0750.
	st, err := os.Stat(e.mnt)
	must(err)
	if sys := st.Sys().(*syscall.Stat_t); sys.Uid != e.uid || st.Mode().Perm() != 0o700 {
		t.Fatalf("root owner %d mode %v", sys.Uid, st.Mode())
	}
	must(os.Chmod(e.mnt, 0o750))
	if st, _ := os.Stat(e.mnt); st.Mode().Perm() != 0o750 {
		t.Fatalf("chmod: %v", st.Mode())
	}
	must(os.Mkdir(filepath.Join(e.mnt, "global"), 0o700))
	conf := filepath.Join(e.mnt, "postgresql.conf")
	must(os.WriteFile(conf, []byte("a = 1\n"), 0o600))
	fa, err := os.OpenFile(conf, os.O_APPEND|os.O_WRONLY, 0)
	must(err)
	_, err = fa.WriteString("b = 2\n")
	must(err)
	must(fa.Sync())
	must(fa.Close())
	if b, _ := os.ReadFile(conf); string(b) != "a = 1\nb = 2\n" {
		t.Fatalf("append: %q", b)
	}
	// A large file, with reads and lseek.
	big := bytes.Repeat([]byte("0123456789abcdef"), 40000) // 640000 bytes
	ctl := filepath.Join(e.mnt, "global/pg_control")
	must(os.WriteFile(ctl, big, 0o600))
	if got, _ := os.ReadFile(ctl); !bytes.Equal(got, big) {
		t.Fatal("large file differs")
	}
	fc, err := os.OpenFile(ctl, os.O_RDWR, 0)
	must(err)
	if n := seekEnd(t, fc); n != int64(len(big)) {
		t.Fatalf("SEEK_END = %d", n)
	}
	must(fc.Truncate(100))
	if n := seekEnd(t, fc); n != 100 {
		t.Fatalf("SEEK_END after truncate = %d", n)
	}
	fc.Close()
	// Write-temp-then-rename replaces the target.
	tmp := filepath.Join(e.mnt, "postgresql.auto.conf.tmp")
	must(os.WriteFile(filepath.Join(e.mnt, "postgresql.auto.conf"), []byte("old"), 0o600))
	must(os.WriteFile(tmp, []byte("new"), 0o600))
	must(os.Rename(tmp, filepath.Join(e.mnt, "postgresql.auto.conf")))
	if b, _ := os.ReadFile(filepath.Join(e.mnt, "postgresql.auto.conf")); string(b) != "new" {
		t.Fatalf("rename: %q", b)
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("rename source remains: %v", err)
	}
	// Folders: rmdir of non-empty fails; unlink; readdir.
	if err := os.Remove(filepath.Join(e.mnt, "global")); !errors.Is(err, syscall.ENOTEMPTY) {
		t.Fatalf("rmdir non-empty: %v", err)
	}
	must(os.Remove(conf))
	ents, err := os.ReadDir(e.mnt)
	must(err)
	var names []string
	for _, d := range ents {
		names = append(names, d.Name())
	}
	sort.Strings(names)
	if want := []string{"global", "postgresql.auto.conf"}; !equal(names, want) {
		t.Fatalf("readdir = %v; want %v", names, want)
	}
	// fsync of a folder (Postgres' fsync_fname(dir, true)) is a durability wait.
	before := fsys.Waits().Count(OpFsync, relpath.KindOther)
	d, err := os.Open(filepath.Join(e.mnt, "global"))
	must(err)
	must(d.Sync())
	d.Close()
	if fsys.Waits().Count(OpFsync, relpath.KindOther) != before+1 {
		t.Fatal("folder fsync did not wait for durability")
	}
	// Local-only files are not stored.
	must(os.WriteFile(filepath.Join(e.mnt, "postmaster.pid"), []byte("123\n"), 0o600))
	// pg_wal: scratch passthrough, W follows WAL writes.
	must(os.Mkdir(filepath.Join(e.mnt, "pg_wal"), 0o700))
	seg := filepath.Join(e.mnt, "pg_wal/000000010000000000000002")
	fw, err := os.OpenFile(seg, os.O_RDWR|os.O_CREATE, 0o600)
	must(err)
	_, err = fw.WriteAt(page('w'), 8192)
	must(err)
	must(fw.Sync())
	fw.Close()
	// A WAL fsync flushes no disk and waits for nothing (the safekeepers
	// make WAL durable); it is counted.
	if n := fsys.Waits().WALFsyncs(); n != 1 {
		t.Fatalf("WAL fsyncs %d, want 1", n)
	}
	wantW := pg.LSN(2*pg.WALSegmentSize + 2*pg.BlockSize)
	if got := fsys.WAL().Current(); got != wantW {
		t.Fatalf("W = %v; want %v", got, wantW)
	}
	if b, err := os.ReadFile(filepath.Join(e.scratch, "000000010000000000000002")); err != nil || len(b) != 2*pg.BlockSize {
		t.Fatalf("scratch: %d bytes, %v", len(b), err)
	}
	// A data write after the WAL write is tagged with W.
	must(os.WriteFile(filepath.Join(e.mnt, "global/pg_filenode.map"), []byte("map"), 0o600))
	if be.MaxW() != wantW {
		t.Fatalf("backend MaxW = %v; want %v", be.MaxW(), wantW)
	}
	if _, err := be.ReadFile(ctx, "postmaster.pid", 0, make([]byte, 10)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("postmaster.pid stored in the backend: %v", err)
	}

	// A fresh compute over the same Backend sees the same tree.
	must(fsys.Unmount())
	e.mount(t, be, nil)
	if b, _ := os.ReadFile(filepath.Join(e.mnt, "postgresql.auto.conf")); string(b) != "new" {
		t.Fatalf("after remount: %q", b)
	}
	if got := size(t, ctl); got != 100 {
		t.Fatalf("pg_control size after remount = %d", got)
	}
	if _, err := os.Stat(filepath.Join(e.mnt, "postmaster.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("postmaster.pid survived: %v", err)
	}
	if b, err := os.ReadFile(seg); err != nil || !bytes.Equal(b[8192:], page('w')) {
		t.Fatalf("pg_wal after remount: %v", err)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestAtomicPages has writers overwrite one block with uniform pages while
// readers check that every page read is uniform: 8 KiB writes are
// all-or-nothing (invariant 3).
func TestAtomicPages(t *testing.T) {
	e := newEnv(t)
	e.mount(t, NewMemory(), nil)
	if err := os.MkdirAll(filepath.Join(e.mnt, "base/1"), 0o700); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(e.mnt, "base/1/1259")
	if err := os.WriteFile(p, page(0), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var torn, reads int
	var mu sync.Mutex
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			f, err := os.OpenFile(p, os.O_RDWR, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			for j := 0; ; j++ {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := f.WriteAt(page(byte(i*100+j%100)), 0); err != nil {
					t.Error(err)
					return
				}
			}
		}(i)
	}
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f, err := os.Open(p)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			buf := make([]byte, pg.BlockSize)
			for j := 0; j < 3000; j++ {
				if _, err := f.ReadAt(buf, 0); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				reads++
				if !bytes.Equal(buf, page(buf[0])) {
					torn++
				}
				mu.Unlock()
			}
		}()
	}
	// Stop the writers once the readers are done.
	go func() {
		for {
			mu.Lock()
			r := reads
			mu.Unlock()
			if r >= 6000 || t.Failed() {
				close(stop)
				return
			}
			syscall.Nanosleep(&syscall.Timespec{Nsec: 1e6}, nil)
		}
	}()
	wg.Wait()
	if torn != 0 {
		t.Fatalf("%d of %d reads saw a torn page", torn, reads)
	}
}

// TestRootInode: the mount's root has a nonzero inode number. Postgres keys
// its System V shared memory on PGDATA's st_ino; 0 is IPC_PRIVATE, with
// which a postmaster started after a killed one can never find and remove
// the dead one's segments (see TestAgentLifecycle for the whole path).
func TestRootInode(t *testing.T) {
	e := newEnv(t)
	e.mount(t, NewMemory(), nil)
	if err := os.Mkdir(filepath.Join(e.mnt, "base"), 0o700); err != nil {
		t.Fatal(err)
	}
	var root, child syscall.Stat_t
	if err := syscall.Stat(e.mnt, &root); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(e.mnt, "base"), &child); err != nil {
		t.Fatal(err)
	}
	if root.Ino != 1 {
		t.Errorf("the root's inode is %d, want 1", root.Ino)
	}
	if child.Ino == 0 || child.Ino == root.Ino {
		t.Errorf("base's inode is %d (the root's %d)", child.Ino, root.Ino)
	}
}
