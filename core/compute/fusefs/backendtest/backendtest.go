// Package backendtest is the acceptance suite for fusefs.Backend
// implementations: every implementation (Memory, LocalDir, the pageserver
// client) runs Run and must pass it.
package backendtest

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/sdk/pg"
)

// Run checks the Backend contract against fresh, empty backends from open.
func Run(t *testing.T, open func(t *testing.T) fusefs.Backend) {
	t.Run("Relations", func(t *testing.T) { relations(t, open(t)) })
	t.Run("Files", func(t *testing.T) { files(t, open(t)) })
	t.Run("ConcurrentPages", func(t *testing.T) { concurrentPages(t, open(t)) })
}

func pageOf(b byte) []byte { return bytes.Repeat([]byte{b}, pg.BlockSize) }

func relations(t *testing.T, be fusefs.Backend) {
	ctx := context.Background()
	rel := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}
	vm := pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.VMFork}
	if _, err := be.Nblocks(ctx, rel); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("Nblocks of missing fork: %v", err)
	}
	if err := be.WritePage(ctx, rel.Page(0), pageOf(1), 10); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("WritePage to missing fork: %v", err)
	}
	for _, r := range []pg.RelTag{rel, vm} {
		if err := be.CreateRel(ctx, r, 10); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := be.Nblocks(ctx, rel); err != nil || n != 0 {
		t.Fatalf("new fork: %d, %v", n, err)
	}
	for i := uint32(0); i < 3; i++ {
		if err := be.WritePage(ctx, rel.Page(i), pageOf(byte(i+1)), pg.LSN(20+i)); err != nil {
			t.Fatal(err)
		}
	}
	// A write past the end leaves a hole of zero pages.
	if err := be.WritePage(ctx, rel.Page(6), pageOf(7), 30); err != nil {
		t.Fatal(err)
	}
	if n, _ := be.Nblocks(ctx, rel); n != 7 {
		t.Fatalf("nblocks = %d; want 7", n)
	}
	buf := make([]byte, pg.BlockSize)
	for blk, want := range map[uint32][]byte{0: pageOf(1), 2: pageOf(3), 4: make([]byte, pg.BlockSize), 6: pageOf(7)} {
		if err := be.ReadPage(ctx, rel.Page(blk), 0, buf); err != nil || !bytes.Equal(buf, want) {
			t.Fatalf("block %d: %v, first byte %d", blk, err, buf[0])
		}
	}
	if err := be.ReadPage(ctx, rel.Page(7), 0, buf); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("read past end: %v", err)
	}
	// Overwrite, truncate, zero-extend.
	if err := be.WritePage(ctx, rel.Page(1), pageOf(9), 40); err != nil {
		t.Fatal(err)
	}
	if err := be.TruncateRel(ctx, rel, 2, 41); err != nil {
		t.Fatal(err)
	}
	if err := be.TruncateRel(ctx, rel, 4, 42); err != nil {
		t.Fatal(err)
	}
	if n, _ := be.Nblocks(ctx, rel); n != 4 {
		t.Fatalf("nblocks after truncate+extend = %d", n)
	}
	if err := be.ReadPage(ctx, rel.Page(1), 0, buf); err != nil || !bytes.Equal(buf, pageOf(9)) {
		t.Fatalf("overwritten block: %v %d", err, buf[0])
	}
	if err := be.ReadPage(ctx, rel.Page(2), 0, buf); err != nil || !bytes.Equal(buf, make([]byte, pg.BlockSize)) {
		t.Fatalf("block truncated away then re-extended must be zero: %v %d", err, buf[0])
	}
	rels, err := be.ListRels(ctx)
	if err != nil || len(rels) != 2 {
		t.Fatalf("ListRels = %v, %v", rels, err)
	}
	// Unlink, then recreate empty (relfilenode reuse).
	if err := be.UnlinkRel(ctx, rel, 50); err != nil {
		t.Fatal(err)
	}
	if _, err := be.Nblocks(ctx, rel); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("after unlink: %v", err)
	}
	if err := be.CreateRel(ctx, rel, 51); err != nil {
		t.Fatal(err)
	}
	if n, _ := be.Nblocks(ctx, rel); n != 0 {
		t.Fatalf("recreated fork has %d blocks", n)
	}
	if err := be.Sync(ctx, 51); err != nil {
		t.Fatal(err)
	}
}

func files(t *testing.T, be fusefs.Backend) {
	ctx := context.Background()
	if err := be.CreateFile(ctx, "global/pg_control", 0o600, 1); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("create without parent: %v", err)
	}
	for _, d := range []string{"global", "pg_xact"} {
		if err := be.Mkdir(ctx, d, 0o700, 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.Mkdir(ctx, "global", 0o700, 1); !errors.Is(err, fusefs.ErrExists) {
		t.Fatalf("mkdir twice: %v", err)
	}
	if err := be.CreateFile(ctx, "pg_xact/0000", 0o600, 2); err != nil {
		t.Fatal(err)
	}
	if err := be.CreateFile(ctx, "pg_xact/0000", 0o600, 2); !errors.Is(err, fusefs.ErrExists) {
		t.Fatalf("create twice: %v", err)
	}
	if err := be.WriteFile(ctx, "pg_xact/0000", 8192, pageOf(5), 3); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 3*pg.BlockSize)
	n, err := be.ReadFile(ctx, "pg_xact/0000", 0, buf)
	if err != nil || n != 2*pg.BlockSize || !bytes.Equal(buf[:8192], make([]byte, 8192)) || !bytes.Equal(buf[8192:n], pageOf(5)) {
		t.Fatalf("ReadFile = %d, %v", n, err)
	}
	if n, err := be.ReadFile(ctx, "pg_xact/0000", 1<<20, buf); n != 0 || err != nil {
		t.Fatalf("read past end = %d, %v", n, err)
	}
	if err := be.TruncateFile(ctx, "pg_xact/0000", 100, 4); err != nil {
		t.Fatal(err)
	}
	if err := be.TruncateFile(ctx, "pg_xact/0000", 200, 4); err != nil {
		t.Fatal(err)
	}
	if n, _ := be.ReadFile(ctx, "pg_xact/0000", 0, buf); n != 200 || !bytes.Equal(buf[100:200], make([]byte, 100)) {
		t.Fatalf("truncate then extend: %d bytes", n)
	}
	// Write-temp-then-rename over an existing file.
	for _, p := range []string{"global/pg_control", "global/pg_control.tmp"} {
		if err := be.CreateFile(ctx, p, 0o600, 5); err != nil {
			t.Fatal(err)
		}
		if err := be.WriteFile(ctx, p, 0, []byte(p), 5); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.Rename(ctx, "global/pg_control.tmp", "global/pg_control", 6); err != nil {
		t.Fatal(err)
	}
	if n, _ := be.ReadFile(ctx, "global/pg_control", 0, buf); string(buf[:n]) != "global/pg_control.tmp" {
		t.Fatalf("after rename: %q", buf[:n])
	}
	if _, err := be.ReadFile(ctx, "global/pg_control.tmp", 0, buf); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("rename source: %v", err)
	}
	// ... and over a longer file: the target is the source, exactly (no
	// tail of the old content).
	long := bytes.Repeat([]byte("x"), 3*8192+7)
	for p, d := range map[string][]byte{"global/auto.conf": long, "global/auto.conf.tmp": []byte("short")} {
		if err := be.CreateFile(ctx, p, 0o600, 6); err != nil {
			t.Fatal(err)
		}
		if err := be.WriteFile(ctx, p, 0, d, 6); err != nil {
			t.Fatal(err)
		}
	}
	if err := be.Rename(ctx, "global/auto.conf.tmp", "global/auto.conf", 6); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, len(long)+10)
	if n, err := be.ReadFile(ctx, "global/auto.conf", 0, big); err != nil || string(big[:n]) != "short" {
		t.Fatalf("after a rename over a longer file: %d bytes %q, %v", n, big[:min(n, 16)], err)
	}
	if err := be.Remove(ctx, "global/auto.conf", 6); err != nil {
		t.Fatal(err)
	}
	if err := be.Remove(ctx, "global", 7); !errors.Is(err, fusefs.ErrNotEmpty) {
		t.Fatalf("remove non-empty folder: %v", err)
	}
	list, err := be.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]fusefs.FileInfo{
		"global":            {Path: "global", Dir: true},
		"pg_xact":           {Path: "pg_xact", Dir: true},
		"global/pg_control": {Path: "global/pg_control", Size: int64(len("global/pg_control.tmp"))},
		"pg_xact/0000":      {Path: "pg_xact/0000", Size: 200},
	}
	seen := map[string]bool{}
	for _, fi := range list {
		w, ok := want[fi.Path]
		if !ok || w.Dir != fi.Dir || (!fi.Dir && w.Size != fi.Size) {
			t.Fatalf("List has %+v", fi)
		}
		if d := parent(fi.Path); d != "" && !seen[d] {
			t.Fatalf("List: %s before its folder", fi.Path)
		}
		seen[fi.Path] = true
	}
	if len(list) != len(want) {
		t.Fatalf("List = %+v", list)
	}
	if err := be.Remove(ctx, "global/pg_control", 8); err != nil {
		t.Fatal(err)
	}
	if err := be.Remove(ctx, "global", 8); err != nil {
		t.Fatal(err)
	}
	if err := be.Remove(ctx, "global", 8); !errors.Is(err, fusefs.ErrNotFound) {
		t.Fatalf("remove twice: %v", err)
	}
}

func parent(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return ""
}

// concurrentPages checks that page writes are all-or-nothing for readers.
func concurrentPages(t *testing.T, be fusefs.Backend) {
	ctx := context.Background()
	rel := pg.RelTag{Spc: 1663, DB: 1, Rel: 1259}
	if err := be.CreateRel(ctx, rel, 1); err != nil {
		t.Fatal(err)
	}
	if err := be.WritePage(ctx, rel.Page(0), pageOf(0), 1); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for j := 0; j < 2000; j++ {
				if err := be.WritePage(ctx, rel.Page(0), pageOf(byte(i*100+j%100)), 2); err != nil {
					t.Error(err)
					return
				}
			}
		}(i)
	}
	torn := 0
	buf := make([]byte, pg.BlockSize)
	for j := 0; j < 4000; j++ {
		if err := be.ReadPage(ctx, rel.Page(0), 0, buf); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(buf, pageOf(buf[0])) {
			torn++
		}
	}
	wg.Wait()
	if torn > 0 {
		t.Fatalf("%d torn page reads", torn)
	}
}
