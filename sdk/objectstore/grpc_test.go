package objectstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

// openShim serves store through the gRPC shim in this process (go-plugin's
// TestPluginGRPCConn: a real gRPC connection over a local socket) and
// returns the host-side client, configured with configJSON.
func openShim(t testing.TB, factory objectstore.PluginFactory, configJSON string) *objectstore.GRPCClient {
	t.Helper()
	// client.Close asks the server to stop (go-plugin's controller
	// Shutdown); calling server.Stop as well races inside go-plugin.
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		objectstore.PluginKind: &objectstore.GRPCPlugin{Factory: factory, Log: zerolog.Nop()},
	})
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(objectstore.PluginKind)
	if err != nil {
		t.Fatalf("Dispense: %v", err)
	}
	c, ok := raw.(*objectstore.GRPCClient)
	if !ok {
		t.Fatalf("Dispense returned %T, want *objectstore.GRPCClient", raw)
	}
	if err := c.Configure(context.Background(), []byte(configJSON)); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return c
}

func memoryFactory([]byte, zerolog.Logger) (objectstore.Store, error) {
	return objectstore.NewMemory(), nil
}

// TestGRPCShimAcceptance runs the acceptance suite against the Memory store
// behind the shim: every call crosses a real gRPC connection.
func TestGRPCShimAcceptance(t *testing.T) {
	// The full 256 MiB object crosses a real process boundary in
	// core/pluginhost's tests; here a smaller one keeps this package quick.
	opts := storetest.Options{StrictClose: true, BigSize: 32 << 20}
	if testing.Short() {
		opts.BigSize = 8 << 20
	}
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		return openShim(t, memoryFactory, "{}")
	}, opts)
}

// errStore fails every call with the error it holds.
type errStore struct{ err error }

func (e errStore) Put(context.Context, string, io.Reader, objectstore.PutOptions) error { return e.err }
func (e errStore) Get(context.Context, string) (io.ReadCloser, error)                   { return nil, e.err }
func (e errStore) GetRange(context.Context, string, int64, int64) (io.ReadCloser, error) {
	return nil, e.err
}
func (e errStore) Stat(context.Context, string) (objectstore.ObjectInfo, error) {
	return objectstore.ObjectInfo{}, e.err
}
func (e errStore) List(context.Context, string, func(objectstore.ObjectInfo) error) error {
	return e.err
}
func (e errStore) Delete(context.Context, string) error { return e.err }
func (e errStore) Close() error                         { return e.err }

// TestGRPCShimErrors checks that each sentinel a plugin returns comes back
// on the host as the same sentinel, with the same text, from every call.
func TestGRPCShimErrors(t *testing.T) {
	cases := []struct {
		err  error
		want []error
		code codes.Code
	}{
		{fmt.Errorf("fs: %w: a/b", objectstore.ErrNotFound), []error{objectstore.ErrNotFound}, codes.NotFound},
		{fmt.Errorf("x: %w", objectstore.ErrExists), []error{objectstore.ErrExists}, codes.AlreadyExists},
		{objectstore.ValidateKey("/bad"), []error{objectstore.ErrInvalidKey}, codes.InvalidArgument},
		{fmt.Errorf("off 9 > size 3: %w", objectstore.ErrInvalidRange), []error{objectstore.ErrInvalidRange}, codes.OutOfRange},
		{objectstore.Transient(errors.New("s3: 503 slow down")), []error{objectstore.ErrTransient}, codes.Unavailable},
		{fmt.Errorf("fs: %w", objectstore.ErrClosed), []error{objectstore.ErrClosed}, codes.FailedPrecondition},
		{fmt.Errorf("fs: read: %w", context.DeadlineExceeded), []error{context.DeadlineExceeded}, codes.DeadlineExceeded},
		{errors.New("disk on fire"), nil, codes.Unknown},
	}
	for _, tc := range cases {
		t.Run(tc.code.String(), func(t *testing.T) {
			c := openShim(t, func([]byte, zerolog.Logger) (objectstore.Store, error) { return errStore{tc.err}, nil }, "")
			ctx := context.Background()
			check := func(call string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: nil error, want %v", call, tc.err)
				}
				if err.Error() != tc.err.Error() {
					t.Errorf("%s: text %q, want %q", call, err.Error(), tc.err.Error())
				}
				for _, w := range tc.want {
					if !errors.Is(err, w) {
						t.Errorf("%s: %v does not match %v", call, err, w)
					}
				}
				for _, other := range []error{objectstore.ErrNotFound, objectstore.ErrExists, objectstore.ErrInvalidKey,
					objectstore.ErrInvalidRange, objectstore.ErrTransient, objectstore.ErrClosed} {
					if errors.Is(err, other) && !errors.Is(tc.err, other) {
						t.Errorf("%s: %v also matches %v", call, err, other)
					}
				}
				if got := status.Code(err); got != tc.code {
					t.Errorf("%s: status code %v, want %v", call, got, tc.code)
				}
			}
			check("Put", c.Put(ctx, "k", strings.NewReader("data"), objectstore.PutOptions{Size: 4}))
			_, err := c.Get(ctx, "k")
			check("Get", err)
			_, err = c.GetRange(ctx, "k", 1, 2)
			check("GetRange", err)
			_, err = c.Stat(ctx, "k")
			check("Stat", err)
			check("List", c.List(ctx, "", func(objectstore.ObjectInfo) error { return nil }))
			check("Delete", c.Delete(ctx, "k"))
			check("Close", c.Close())
		})
	}
}

// TestGRPCShimConfigure checks that the plugin receives the host's config
// bytes, that a factory error reaches the host, and that calls before
// Configure fail clearly.
func TestGRPCShimConfigure(t *testing.T) {
	var got []byte
	c := openShim(t, func(cfg []byte, _ zerolog.Logger) (objectstore.Store, error) {
		got = append([]byte(nil), cfg...)
		return objectstore.NewMemory(), nil
	}, `{"root":"/x"}`)
	if string(got) != `{"root":"/x"}` {
		t.Fatalf("factory got config %q", got)
	}
	if err := c.Configure(context.Background(), []byte("{}")); err == nil || !strings.Contains(err.Error(), "already configured") {
		t.Fatalf("second Configure: %v, want an 'already configured' error", err)
	}

	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		objectstore.PluginKind: &objectstore.GRPCPlugin{Factory: func([]byte, zerolog.Logger) (objectstore.Store, error) {
			return nil, errors.New("root must be set")
		}},
	})
	defer client.Close()
	raw, err := client.Dispense(objectstore.PluginKind)
	if err != nil {
		t.Fatal(err)
	}
	bad := raw.(*objectstore.GRPCClient)
	if _, err := bad.Stat(context.Background(), "k"); err == nil || !strings.Contains(err.Error(), "Configure was not called") {
		t.Fatalf("Stat before Configure: %v", err)
	}
	if err := bad.Configure(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "root must be set") {
		t.Fatalf("Configure with a failing factory: %v", err)
	}
}

// TestGRPCShimPutSourceError checks that a Put whose reader fails midway
// stores nothing on the plugin side, and that the error names the reader.
func TestGRPCShimPutSourceError(t *testing.T) {
	mem := objectstore.NewMemory()
	c := openShim(t, func([]byte, zerolog.Logger) (objectstore.Store, error) { return mem, nil }, "")
	boom := errors.New("source broke")
	r := io.MultiReader(bytes.NewReader(make([]byte, 3<<20)), &failAfter{err: boom})
	err := c.Put(context.Background(), "k", r, objectstore.PutOptions{Size: -1})
	if !errors.Is(err, boom) {
		t.Fatalf("Put: %v, want the source's error", err)
	}
	if _, err := mem.Stat(context.Background(), "k"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("after a failed Put the plugin's store has the key: %v", err)
	}
}

type failAfter struct{ err error }

func (f *failAfter) Read([]byte) (int, error) { return 0, f.err }

// TestGRPCShimModTime checks that ModTime crosses with nanoseconds, and
// that a zero ModTime stays zero.
func TestGRPCShimModTime(t *testing.T) {
	c := openShim(t, memoryFactory, "")
	ctx := context.Background()
	if err := c.Put(ctx, "a", strings.NewReader("x"), objectstore.PutOptions{Size: 1}); err != nil {
		t.Fatal(err)
	}
	oi, err := c.Stat(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if oi.Key != "a" || oi.Size != 1 || oi.ModTime.IsZero() {
		t.Fatalf("Stat: %+v", oi)
	}
}

// BenchmarkGRPCShimStat is a Stat through the shim over a real gRPC
// connection in this process (no subprocess, no TLS): the floor of the
// external plugin's cost (core/pluginhost's benchmarks add the process
// boundary and mTLS).
func BenchmarkGRPCShimStat(b *testing.B) {
	c := openShim(b, memoryFactory, "")
	ctx := context.Background()
	if err := c.Put(ctx, "k", strings.NewReader("x"), objectstore.PutOptions{Size: 1}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Stat(ctx, "k"); err != nil {
			b.Fatal(err)
		}
	}
}

// TestGRPCShimCancelledText: a call with a cancelled context fails with an
// error matching context.Canceled whose text says so once.
func TestGRPCShimCancelledText(t *testing.T) {
	c := openShim(t, memoryFactory, "")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := c.Stat(ctx, "k")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Stat: %v", err)
	}
	if strings.Count(err.Error(), "context canceled") != 1 {
		t.Fatalf("Stat error text %q", err)
	}
}
