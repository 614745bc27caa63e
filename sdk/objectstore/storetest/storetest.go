// Package storetest is the acceptance suite of the objectstore.Store
// contract. Every implementation, builtin or external (through its gRPC
// shim), and every wrapper runs it:
//
//	func TestAcceptance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) objectstore.Store {
//			return newEmptyStore(t)
//		})
//	}
//
// Each subtest calls open once (a few call it twice) and expects an empty
// store; a store over a shared bucket can give each call a fresh prefix with
// objectstore.WithPrefix. The suite closes every store it opens.
//
// It is not a benchmark: it asserts behaviour, including the slow parts (a
// listing past 1,000 objects, a 256 MiB streamed object), which Options can
// shrink for slow emulators.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/stratadb/strata/sdk/objectstore"
)

// Options tune the suite. The zero value runs everything at full size.
type Options struct {
	// ListCount is how many objects the pagination test creates (default
	// 1,100: more than one page of S3, GCS and Azure listings).
	ListCount int
	// Parallel is how many goroutines create objects in the bulk tests
	// (default 16).
	Parallel int
	// BigSize is the size of the streamed big object (default 256 MiB, or
	// 32 MiB under go test -short). Negative skips the test.
	BigSize int64
	// BigHeapLimit, when positive, fails the big-object test if the Go heap
	// of this process grows by more than that many bytes while it streams
	// the object in and out (a check that the store streams). Leave it zero
	// for stores that keep objects in this process's memory.
	BigHeapLimit int64
	// Racers is how many goroutines race a conditional create (default 16).
	Racers int
	// StrictClose requires calls after Close to fail with
	// objectstore.ErrClosed (the contract also allows the backend's own
	// error, which is all that is required by default).
	StrictClose bool
	// ModelOps is the number of random operations the MatchesReference
	// test applies to the store and to the in-memory reference store
	// (default 1,000).
	ModelOps int
	// MaxKeyLen is the longest key the store must accept (default
	// objectstore.MaxKeyLen). A store made by objectstore.WithPrefix
	// accepts keys shorter by the prefix and its slash.
	MaxKeyLen int
}

func (o Options) withDefaults() Options {
	if o.ListCount == 0 {
		o.ListCount = 1100
	}
	if o.Parallel <= 0 {
		o.Parallel = 16
	}
	if o.BigSize == 0 {
		o.BigSize = 256 << 20
		if testing.Short() {
			o.BigSize = 32 << 20
		}
	}
	if o.ModelOps <= 0 {
		o.ModelOps = 1000
	}
	if o.MaxKeyLen <= 0 {
		o.MaxKeyLen = objectstore.MaxKeyLen
	}
	if o.Racers <= 0 {
		o.Racers = 16
	}
	return o
}

// Run runs the suite with default Options.
func Run(t *testing.T, open func(t *testing.T) objectstore.Store) {
	RunOptions(t, open, Options{})
}

// RunOptions runs the suite. open must return an empty store; the suite
// closes it at the end of the subtest.
func RunOptions(t *testing.T, open func(t *testing.T) objectstore.Store, opts Options) {
	opts = opts.withDefaults()
	s := &suite{open: open, opts: opts}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"PutGet", s.testPutGet},
		{"Overwrite", s.testOverwrite},
		{"OverwriteAtomic", s.testOverwriteAtomic},
		{"PutInProgressInvisible", s.testPutInProgress},
		{"GetRange", s.testGetRange},
		{"Stat", s.testStat},
		{"NotFound", s.testNotFound},
		{"Delete", s.testDelete},
		{"InvalidKeys", s.testInvalidKeys},
		{"ValidKeys", s.testValidKeys},
		{"KeyIsAlsoPrefix", s.testKeyIsAlsoPrefix},
		{"ListOrder", s.testListOrder},
		{"ListStopsOnError", s.testListStopsOnError},
		{"ListPagination", s.testListPagination},
		{"ConditionalCreate", s.testConditionalCreate},
		{"PutFile", s.testPutFile},
		{"ConditionalCreateRace", s.testConditionalCreateRace},
		{"ConcurrentWriters", s.testConcurrentWriters},
		{"FailedPutInvisible", s.testFailedPut},
		{"CancelPut", s.testCancelPut},
		{"CancelledContext", s.testCancelledContext},
		{"MatchesReference", s.testMatchesReference},
		{"BigObject", s.testBig},
		{"Close", s.testClose},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	open func(t *testing.T) objectstore.Store
	opts Options
}

// store opens a store that the suite closes at the end of t, after checking
// that it starts empty.
func (s *suite) store(t *testing.T) objectstore.Store {
	t.Helper()
	st := s.openRaw(t)
	t.Cleanup(func() {
		if err := st.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return st
}

func (s *suite) openRaw(t *testing.T) objectstore.Store {
	t.Helper()
	st := s.open(t)
	if st == nil {
		t.Fatal("open returned a nil store")
	}
	keys := listKeys(t, st, "")
	if len(keys) != 0 {
		t.Fatalf("open must return an empty store; List found %d objects, first %q", len(keys), keys[0])
	}
	return st
}

// --- helpers ---------------------------------------------------------------

func put(t *testing.T, st objectstore.Store, key string, data []byte) {
	t.Helper()
	err := st.Put(context.Background(), key, bytes.NewReader(data), objectstore.PutOptions{Size: int64(len(data))})
	if err != nil {
		t.Fatalf("Put(%q, %d bytes): %v", key, len(data), err)
	}
}

func get(t *testing.T, st objectstore.Store, key string) []byte {
	t.Helper()
	rc, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return readClose(t, rc, fmt.Sprintf("Get(%q)", key))
}

func getRange(t *testing.T, st objectstore.Store, key string, off, n int64) []byte {
	t.Helper()
	rc, err := st.GetRange(context.Background(), key, off, n)
	if err != nil {
		t.Fatalf("GetRange(%q, %d, %d): %v", key, off, n, err)
	}
	return readClose(t, rc, fmt.Sprintf("GetRange(%q, %d, %d)", key, off, n))
}

func readClose(t *testing.T, rc io.ReadCloser, what string) []byte {
	t.Helper()
	b, err := io.ReadAll(rc)
	if cerr := rc.Close(); cerr != nil {
		t.Errorf("%s: closing the reader: %v", what, cerr)
	}
	if err != nil {
		t.Fatalf("%s: reading: %v", what, err)
	}
	return b
}

func wantBytes(t *testing.T, what string, got, want []byte) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	t.Fatalf("%s: got %d bytes, want %d; first difference at byte %d", what, len(got), len(want), i)
}

func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("%s: got error %v, want one matching %v (errors.Is)", what, err, target)
	}
}

func listInfos(t *testing.T, st objectstore.Store, prefix string) []objectstore.ObjectInfo {
	t.Helper()
	var out []objectstore.ObjectInfo
	err := st.List(context.Background(), prefix, func(oi objectstore.ObjectInfo) error {
		out = append(out, oi)
		return nil
	})
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return out
}

func listKeys(t *testing.T, st objectstore.Store, prefix string) []string {
	t.Helper()
	var keys []string
	for _, oi := range listInfos(t, st, prefix) {
		keys = append(keys, oi.Key)
	}
	return keys
}

func wantKeys(t *testing.T, what string, got, want []string) {
	t.Helper()
	if len(got) == len(want) {
		same := true
		for i := range got {
			if got[i] != want[i] {
				same = false
				break
			}
		}
		if same {
			return
		}
	}
	t.Fatalf("%s:\n got  %q\n want %q", what, got, want)
}

// wantNotFound checks that Get, GetRange and Stat all report key missing.
func wantNotFound(t *testing.T, st objectstore.Store, key string) {
	t.Helper()
	ctx := context.Background()
	if rc, err := st.Get(ctx, key); !errors.Is(err, objectstore.ErrNotFound) {
		if err == nil {
			rc.Close()
		}
		t.Fatalf("Get(%q): got error %v, want ErrNotFound", key, err)
	}
	if rc, err := st.GetRange(ctx, key, 0, 1); !errors.Is(err, objectstore.ErrNotFound) {
		if err == nil {
			rc.Close()
		}
		t.Fatalf("GetRange(%q, 0, 1): got error %v, want ErrNotFound", key, err)
	}
	if _, err := st.Stat(ctx, key); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("Stat(%q): got error %v, want ErrNotFound", key, err)
	}
}
