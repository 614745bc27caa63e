package azure_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/plugins/objectstore/azure"
	"github.com/stratadb/strata/plugins/objectstore/azure/azuretest"
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
	t.Setenv(azure.ConnectionStringEnv, "")
	good := azure.Config{Container: "strata-data", Prefix: "prod/", AccountURL: "https://acct.blob.core.windows.net/"}
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	cases := []struct {
		mut  func(*azure.Config)
		want string
	}{
		{func(c *azure.Config) { c.Container = "" }, "azure.container: required"},
		{func(c *azure.Config) { c.Container = "Upper" }, "azure.container:"},
		{func(c *azure.Config) { c.Container = "a--b" }, "azure.container:"},
		{func(c *azure.Config) { c.Prefix = "/x" }, "azure.prefix:"},
		{func(c *azure.Config) { c.AccountURL = "" }, "azure.account_url: required"},
		{func(c *azure.Config) { c.ConnectionString = "AccountName=a;AccountKey=k" }, "azure.connection_string: set connection_string or account_url, not both"},
		{func(c *azure.Config) { c.AccountURL = "acct.blob.core.windows.net" }, "azure.account_url:"},
		{func(c *azure.Config) { c.BlockSize = -1 }, "azure.block_size:"},
		{func(c *azure.Config) { c.UploadConcurrency = -1 }, "azure.upload_concurrency:"},
		{func(c *azure.Config) { c.AccountURL = ""; c.ConnectionString = "secret-without-pairs" }, "azure.connection_string: not a connection string"},
	}
	for _, c := range cases {
		cfg := good
		c.mut(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%v) = %v, want an error containing %q", cfg, err, c.want)
		}
		if err != nil && cfg.ConnectionString != "" && strings.Contains(err.Error(), cfg.ConnectionString) {
			t.Errorf("Validate error shows the connection string: %v", err)
		}
		if _, err := azure.New(context.Background(), cfg, zerolog.Nop()); err == nil {
			t.Errorf("New(%v) accepted an invalid config", cfg)
		}
	}
	// The connection string may come from the environment instead.
	t.Setenv(azure.ConnectionStringEnv, "AccountName=a;AccountKey=k")
	if err := (azure.Config{Container: "abc"}).Validate(); err != nil {
		t.Errorf("Validate with %s set: %v", azure.ConnectionStringEnv, err)
	}
	// String and %v never show the secret.
	cfg := azure.Config{Container: "abc", ConnectionString: "AccountName=a;AccountKey=TOPSECRET"}
	for _, s := range []string{cfg.String(), fmt.Sprintf("%v", cfg), fmt.Sprintf("%+v", cfg)} {
		if strings.Contains(s, "TOPSECRET") {
			t.Errorf("config printed with its key: %s", s)
		}
	}
}

// TestAzurite starts one Azurite (its start takes seconds) for the
// acceptance suite and the Azure-specific tests.
func TestAzurite(t *testing.T) {
	az := azuretest.StartAzurite(t)
	t.Run("Acceptance", func(t *testing.T) { testAcceptance(t, az) })
	t.Run("Blocks", func(t *testing.T) { testBlocks(t, az) })
	t.Run("PrefixIsolation", func(t *testing.T) { testPrefixIsolation(t, az) })
	t.Run("Plugin", func(t *testing.T) { testPlugin(t, az) })
	t.Run("MissingContainer", func(t *testing.T) { testMissingContainer(t, az) })
}

// testMissingContainer: a container that does not exist is an error of
// its own, neither not found nor transient, that names the container and
// the key that makes it, in one line.
func testMissingContainer(t *testing.T, az *azuretest.Azurite) {
	cfg := az.Config("absent", "p")
	cfg.CreateContainer = false
	st, err := azure.New(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	err = st.List(context.Background(), "", func(objectstore.ObjectInfo) error { return nil })
	if err == nil || errors.Is(err, objectstore.ErrNotFound) || objectstore.IsTransient(err) ||
		!strings.Contains(err.Error(), `container "absent" does not exist`) || !strings.Contains(err.Error(), "create_container") ||
		strings.Contains(err.Error(), "\n") || !bloberror.HasCode(err, bloberror.ContainerNotFound) {
		t.Fatalf("List on a missing container: %v", err)
	}
}

var runs atomic.Int64

func opener(f *azuretest.Azurite, tune func(*azure.Config)) func(t *testing.T) *azure.Store {
	return func(t *testing.T) *azure.Store {
		cfg := f.Config("strata-test", fmt.Sprintf("run/%d", runs.Add(1)))
		if tune != nil {
			tune(&cfg)
		}
		st, err := azure.New(context.Background(), cfg, testLogger(t))
		if err != nil {
			t.Fatalf("azure.New: %v", err)
		}
		return st
	}
}

// testAcceptance runs the objectstore acceptance suite against Azurite.
func testAcceptance(t *testing.T, az *azuretest.Azurite) {
	open := opener(az, nil)
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store { return open(t) }, storetest.Options{
		MaxKeyLen: objectstore.MaxKeyLen - len("run/NN/"),
		// UploadStream's block buffers are mmapped outside the Go heap,
		// so this bounds the rest: the object must not be held.
		BigHeapLimit: 64 << 20,
	})
}

// testBlocks drives the staged-block upload path with 1 MiB blocks: known
// and unknown sizes, conditional creates that lose at Put Block List, a
// race, and a failing body that must leave nothing.
func testBlocks(t *testing.T, az *azuretest.Azurite) {
	open := opener(az, func(c *azure.Config) { c.BlockSize = 1 << 20 })
	st := open(t)
	defer st.Close()
	// Four blocks, the last one short; the failing body dies after two.
	storetest.RunMultipart(t, st, storetest.MultipartOptions{Prefix: "bl", Size: 3<<20 + 17, FailAfter: 2<<20 + 5})
}

// testPrefixIsolation: stores on prefixes "iso/a" and "iso/ab" of one bucket
// see only their own objects, and the prefix counts against the key length.
func testPrefixIsolation(t *testing.T, f *azuretest.Azurite) {
	ctx := context.Background()
	open := func(prefix string) *azure.Store {
		st, err := azure.New(ctx, f.Config("iso-container", prefix), testLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	a, ab, root := open("iso/a/"), open("iso/ab"), open("")
	for _, st := range []*azure.Store{a, ab} {
		if err := st.Put(ctx, "k", strings.NewReader(st.Prefix()), objectstore.PutOptions{Size: int64(len(st.Prefix()))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, st := range []*azure.Store{a, ab} {
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
	// Keys with "[" and "\\" are stored encoded (see names.go) and list
	// back as themselves, in byte order.
	odd := []string{"odd/[", "odd/[[]", "odd/Z", "odd/\\", "odd/\\[x", "odd/]"}
	for _, k := range odd {
		if err := a.Put(ctx, k, strings.NewReader(k), objectstore.PutOptions{Size: int64(len(k))}); err != nil {
			t.Fatal(err)
		}
	}
	var oddKeys []string
	if err := a.List(ctx, "odd/", func(oi objectstore.ObjectInfo) error { oddKeys = append(oddKeys, oi.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	sorted := append([]string(nil), odd...)
	sort.Strings(sorted)
	if strings.Join(oddKeys, "|") != strings.Join(sorted, "|") {
		t.Fatalf("List(odd/) = %q, want %q", oddKeys, sorted)
	}
	for _, k := range odd {
		if got := storetest.ReadAll(t, a, k); string(got) != k {
			t.Fatalf("Get(%q) = %q", k, got)
		}
	}
	long := strings.Repeat("x", objectstore.MaxKeyLen-len("iso/a/")+1)
	if err := a.Put(ctx, long, strings.NewReader("x"), objectstore.PutOptions{Size: 1}); !errors.Is(err, objectstore.ErrInvalidKey) {
		t.Fatalf("Put of a key that is too long with the prefix: %v, want ErrInvalidKey", err)
	}
}
