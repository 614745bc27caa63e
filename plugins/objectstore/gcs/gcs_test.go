package gcs_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/gcs"
	"github.com/stratadb/strata/plugins/objectstore/gcs/gcstest"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

func testLogger(t *testing.T) zerolog.Logger {
	if testing.Verbose() {
		return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel)
	}
	return zerolog.Nop()
}

func TestConfigValidate(t *testing.T) {
	good := gcs.Config{Bucket: "b", Prefix: "strata/prod/"}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cases := []struct {
		mut  func(*gcs.Config)
		want string
	}{
		{func(c *gcs.Config) { c.Bucket = "" }, "gcs.bucket: required"},
		{func(c *gcs.Config) { c.Bucket = "a b" }, "gcs.bucket:"},
		{func(c *gcs.Config) { c.Prefix = "a/../b" }, "gcs.prefix:"},
		{func(c *gcs.Config) { c.Endpoint = "localhost:4443" }, "gcs.endpoint:"},
		{func(c *gcs.Config) { c.ChunkSize = -1 }, "gcs.chunk_size:"},
		{func(c *gcs.Config) { c.CreateBucket = true }, "gcs.project_id: required with create_bucket"},
	}
	for _, c := range cases {
		cfg := good
		c.mut(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%+v) = %v, want an error containing %q", cfg, err, c.want)
		}
		if _, err := gcs.New(context.Background(), cfg, zerolog.Nop()); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", cfg)
		}
	}
}

func emulator(t *testing.T, tune func(*gcs.Config)) func(t *testing.T) *gcs.Store {
	f := gcstest.StartFakeGCS(t)
	f.SetEnv(t)
	var n atomic.Int64
	return func(t *testing.T) *gcs.Store {
		cfg := f.Config("strata-test", fmt.Sprintf("run/%d", n.Add(1)))
		if tune != nil {
			tune(&cfg)
		}
		st, err := gcs.New(context.Background(), cfg, testLogger(t))
		if err != nil {
			t.Fatalf("gcs.New: %v", err)
		}
		return st
	}
}

// TestAcceptance runs the objectstore acceptance suite against
// fake-gcs-server. The emulator keeps objects in this process's memory, so
// the heap check of the big object cannot apply. Its resumable uploads slow
// down as the object grows (a 256 MiB Put took 56 s on a loaded machine,
// against 3 s for versitygw), but the issue asks for 256 MiB on every store,
// so it runs at full size.
func TestAcceptance(t *testing.T) {
	open := emulator(t, nil)
	big := int64(256 << 20)
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store { return open(t) },
		storetest.Options{MaxKeyLen: objectstore.MaxKeyLen - len("run/NN/"), BigSize: big})
}

// TestResumable drives the resumable (multi-chunk) upload path with small
// chunks: known and unknown sizes, conditional creates that lose at the
// final commit, a race, and a failing body that must leave nothing.
func TestResumable(t *testing.T) {
	open := emulator(t, func(c *gcs.Config) { c.ChunkSize = 256 << 10 })
	st := open(t)
	defer st.Close()
	// Five chunks, the last one short; the failing body dies after two.
	storetest.RunMultipart(t, st, storetest.MultipartOptions{Prefix: "rs", Size: 1<<20 + 17, FailAfter: 700 << 10})
}

// TestPrefixIsolation: stores on prefixes "iso/a" and "iso/ab" of one bucket
// see only their own objects, and the prefix counts against the key length.
func TestPrefixIsolation(t *testing.T) {
	f := gcstest.StartFakeGCS(t)
	f.SetEnv(t)
	ctx := context.Background()
	open := func(prefix string) *gcs.Store {
		st, err := gcs.New(ctx, f.Config("iso-bucket", prefix), testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, ab, root := open("iso/a/"), open("iso/ab"), open("")
	for _, st := range []*gcs.Store{a, ab} {
		if err := st.Put(ctx, "k", strings.NewReader(st.Prefix()), objectstore.PutOptions{Size: int64(len(st.Prefix()))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []*gcs.Store{a, ab} {
		var keys []string
		if err := st.List(ctx, "", func(oi objectstore.ObjectInfo) error { keys = append(keys, oi.Key); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 || keys[0] != "k" {
			t.Fatalf("store %q lists %q, want [k]", st.Prefix(), keys)
		}
		if got := storetest.ReadAll(t, st, "k"); string(got) != st.Prefix() {
			t.Fatalf("store %q reads %q", st.Prefix(), got)
		}
		// A length that would overflow off+length reads to the end.
		rc, err := st.GetRange(ctx, "k", 1, math.MaxInt64)
		if err != nil {
			t.Fatalf("GetRange(k, 1, MaxInt64): %v", err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(got) != st.Prefix()[1:] {
			t.Fatalf("GetRange(k, 1, MaxInt64) = %q, %v; want %q", got, err, st.Prefix()[1:])
		}
	}
	var keys []string
	if err := root.List(ctx, "iso/", func(oi objectstore.ObjectInfo) error { keys = append(keys, oi.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(keys, ",") != "iso/a/k,iso/ab/k" {
		t.Fatalf("root store lists %q, want [iso/a/k iso/ab/k]", keys)
	}
	long := strings.Repeat("x", objectstore.MaxKeyLen-len("iso/a/")+1)
	if err := a.Put(ctx, long, strings.NewReader("x"), objectstore.PutOptions{Size: 1}); !errors.Is(err, objectstore.ErrInvalidKey) {
		t.Fatalf("Put of a key that is too long with the prefix: %v, want ErrInvalidKey", err)
	}
}

// TestMissingBucket: a bucket that does not exist is an error of its own,
// neither not found nor transient, that names the bucket and the key
// that makes it.
func TestMissingBucket(t *testing.T) {
	open := emulator(t, func(c *gcs.Config) { c.Bucket, c.CreateBucket = "absent", false })
	st := open(t)
	defer st.Close()
	err := st.List(context.Background(), "", func(objectstore.ObjectInfo) error { return nil })
	if err == nil || errors.Is(err, objectstore.ErrNotFound) || objectstore.IsTransient(err) ||
		!strings.Contains(err.Error(), `bucket "absent" does not exist`) || !strings.Contains(err.Error(), "create_bucket") {
		t.Fatalf("List on a missing bucket: %v", err)
	}
}
