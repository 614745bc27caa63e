package storetest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
)

// testPutFile: objectstore.PutFile (the store's own FilePutter, or a copy)
// stores a file's bytes; the object outlives the file's removal and a later
// replacement of the file under the same name; Size and IfNotExists hold as
// for Put.
func (s *suite) testPutFile(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	dir := t.TempDir()
	src := filepath.Join(dir, "layer")
	data := Pattern{Seed: 7}.Bytes(0, 300<<10+5)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := objectstore.PutFile(ctx, st, "pf/a", src, objectstore.PutOptions{Size: int64(len(data))}); err != nil {
		t.Fatalf("PutFile: %v", err)
	}
	wantBytes(t, "Get after PutFile", get(t, st, "pf/a"), data)

	// The file goes, and another file takes its name (a layer evicted,
	// then downloaded again): the object keeps the first bytes.
	if err := os.Remove(src); err != nil {
		t.Fatal(err)
	}
	other := Pattern{Seed: 8}.Bytes(0, 1000)
	if err := os.WriteFile(src, other, 0o644); err != nil {
		t.Fatal(err)
	}
	wantBytes(t, "Get after the file was removed and replaced", get(t, st, "pf/a"), data)

	// A wrong Size fails and stores nothing.
	err := objectstore.PutFile(ctx, st, "pf/b", src, objectstore.PutOptions{Size: 5})
	if err == nil {
		t.Fatal("PutFile with a wrong Size succeeded")
	}
	if _, err := st.Stat(ctx, "pf/b"); err == nil {
		t.Fatal("a PutFile with a wrong Size left an object")
	}
	// Conditional create.
	err = objectstore.PutFile(ctx, st, "pf/a", src, objectstore.PutOptions{Size: int64(len(other)), IfNotExists: true})
	wantErr(t, "PutFile IfNotExists on an existing key", err, objectstore.ErrExists)
	wantBytes(t, "Get after a lost conditional PutFile", get(t, st, "pf/a"), data)
	if err := objectstore.PutFile(ctx, st, "pf/c", src, objectstore.PutOptions{Size: -1, IfNotExists: true}); err != nil {
		t.Fatalf("PutFile IfNotExists on a new key: %v", err)
	}
	wantBytes(t, "Get after a conditional PutFile", get(t, st, "pf/c"), other)
	// A missing file is an error, not an empty object.
	if err := objectstore.PutFile(ctx, st, "pf/d", filepath.Join(dir, "missing"), objectstore.PutOptions{Size: -1}); err == nil {
		t.Fatal("PutFile of a missing file succeeded")
	}
	if _, err := st.Stat(ctx, "pf/d"); err == nil {
		t.Fatal("a PutFile of a missing file left an object")
	}
}
