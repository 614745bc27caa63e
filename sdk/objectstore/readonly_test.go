package objectstore_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
)

// TestReadOnly: reads reach the store; Put and Delete are refused and
// change nothing.
func TestReadOnly(t *testing.T) {
	ctx := context.Background()
	inner := objectstore.NewMemory()
	if err := inner.Put(ctx, "a/x", strings.NewReader("xx"), objectstore.PutOptions{Size: 2}); err != nil {
		t.Fatal(err)
	}
	ro := objectstore.ReadOnly(inner)
	r, err := ro.Get(ctx, "a/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "xx" {
		t.Fatalf("Get: %q", b)
	}
	n := 0
	if err := ro.List(ctx, "a/", func(objectstore.ObjectInfo) error { n++; return nil }); err != nil || n != 1 {
		t.Fatalf("List: %d objects, %v", n, err)
	}
	if err := ro.Put(ctx, "a/y", strings.NewReader("y"), objectstore.PutOptions{Size: 1}); !errors.Is(err, objectstore.ErrReadOnly) {
		t.Errorf("Put: %v, want ErrReadOnly", err)
	}
	if err := ro.Delete(ctx, "a/x"); !errors.Is(err, objectstore.ErrReadOnly) {
		t.Errorf("Delete: %v, want ErrReadOnly", err)
	}
	if _, err := inner.Stat(ctx, "a/y"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Errorf("the refused Put reached the store: %v", err)
	}
	if _, err := inner.Stat(ctx, "a/x"); err != nil {
		t.Errorf("the refused Delete reached the store: %v", err)
	}
}
