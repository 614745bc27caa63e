package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
)

// MultipartOptions shape RunMultipart.
type MultipartOptions struct {
	// Prefix starts every key the check writes ("mp" gives "mp/race").
	Prefix string
	// Size is the object size; pick it so that it takes several parts,
	// chunks or blocks of the store's upload path, the last one short.
	Size int64
	// FailAfter is how many bytes a failing body yields before its error;
	// pick it past the first part so that a partial upload exists.
	FailAfter int64
	// Racers is how many conditional creates race for one key (default 4).
	Racers int
}

// RunMultipart checks a store's multi-part upload path (S3 multipart, GCS
// resumable, Azure staged blocks), which the main suite reaches only with
// its big object: known and unknown sizes round-trip, a conditional create
// that loses at the final commit leaves the object unchanged, exactly one of
// several racing conditional creates wins and its bytes are stored, and a
// body that fails, or is longer than PutOptions.Size, leaves nothing.
func RunMultipart(t *testing.T, st objectstore.Store, o MultipartOptions) {
	t.Helper()
	if o.Racers == 0 {
		o.Racers = 4
	}
	ctx := context.Background()
	size := o.Size
	key := func(name string) string { return o.Prefix + "/" + name }
	p := Pattern{Seed: 7}
	for _, known := range []bool{true, false} {
		k := key(fmt.Sprintf("known-%v", known))
		opts := objectstore.PutOptions{Size: -1, IfNotExists: true}
		if known {
			opts.Size = size
		}
		if err := st.Put(ctx, k, p.Reader(size), opts); err != nil {
			t.Fatalf("multi-part Put %+v: %v", opts, err)
		}
		if got := ReadAll(t, st, k); !bytes.Equal(got, p.Bytes(0, size)) {
			t.Fatalf("Get(%q) after multi-part Put: %d bytes, content differs", k, len(got))
		}
		// A conditional create of the same key, also multi-part, loses.
		err := st.Put(ctx, k, Pattern{Seed: 8}.Reader(size), opts)
		if !errors.Is(err, objectstore.ErrExists) {
			t.Fatalf("second multi-part Put IfNotExists: %v, want ErrExists", err)
		}
		if got := ReadAll(t, st, k); !bytes.Equal(got, p.Bytes(0, size)) {
			t.Fatalf("Get(%q) after a lost conditional create changed", k)
		}
	}

	race := key("race")
	errs := make([]error, o.Racers)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = st.Put(ctx, race, Pattern{Seed: uint64(100 + i)}.Reader(size),
				objectstore.PutOptions{Size: size, IfNotExists: true})
		}()
	}
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Fatalf("racers %d and %d both won", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, objectstore.ErrExists):
			t.Fatalf("racer %d: %v, want ErrExists", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no racer won")
	}
	if got := ReadAll(t, st, race); !bytes.Equal(got, Pattern{Seed: uint64(100 + winner)}.Bytes(0, size)) {
		t.Fatalf("%s does not hold the winner's bytes", race)
	}

	// A body that fails after the first parts: no object.
	errBody := errors.New("body failed")
	failed := key("failed")
	err := st.Put(ctx, failed, newFailingReader(p, o.FailAfter, errBody), objectstore.PutOptions{Size: -1})
	if !errors.Is(err, errBody) {
		t.Fatalf("Put with a failing body: %v, want it to wrap the body's error", err)
	}
	if _, err := st.Stat(ctx, failed); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("Stat after a failed multi-part Put: %v, want ErrNotFound", err)
	}
	// A body longer than PutOptions.Size fails too.
	long := key("long")
	if err := st.Put(ctx, long, p.Reader(size), objectstore.PutOptions{Size: size - 1}); err == nil {
		t.Fatal("Put with a body longer than Size succeeded")
	}
	if _, err := st.Stat(ctx, long); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("Stat after a Put with a wrong Size: %v, want ErrNotFound", err)
	}
}

// ReadAll returns the whole object key, failing the test on any error.
func ReadAll(t testing.TB, st objectstore.Store, key string) []byte {
	t.Helper()
	rc, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("reading %q: %v", key, err)
	}
	return b
}
