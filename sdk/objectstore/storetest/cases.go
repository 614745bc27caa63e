package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratadb/strata/sdk/objectstore"
)

// closeRecorder is a reader that records whether Close was called on it.
type closeRecorder struct {
	io.Reader
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

func (s *suite) testPutGet(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	for i, size := range []int64{0, 1, 8192, 1<<20 + 3} {
		for _, known := range []bool{true, false} {
			key := fmt.Sprintf("putget/%d-%v", size, known)
			data := Pattern{Seed: uint64(i)}.Bytes(0, size)
			opts := objectstore.PutOptions{Size: -1}
			if known {
				opts.Size = size
			}
			r := &closeRecorder{Reader: bytes.NewReader(data)}
			if err := st.Put(ctx, key, r, opts); err != nil {
				t.Fatalf("Put(%q, %d bytes, Size %d): %v", key, size, opts.Size, err)
			}
			if r.closed {
				t.Fatalf("Put(%q) closed the reader; the contract says Put does not close r", key)
			}
			wantBytes(t, fmt.Sprintf("Get(%q) after Put", key), get(t, st, key), data)
		}
	}
}

func (s *suite) testOverwrite(t *testing.T) {
	st := s.store(t)
	a := Pattern{Seed: 1}.Bytes(0, 5000)
	b := Pattern{Seed: 2}.Bytes(0, 1234)
	put(t, st, "ow/key", a)
	put(t, st, "ow/key", b)
	wantBytes(t, "Get after overwrite with a shorter object", get(t, st, "ow/key"), b)
	info, err := st.Stat(context.Background(), "ow/key")
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if info.Size != int64(len(b)) {
		t.Fatalf("Stat after overwrite: Size %d, want %d", info.Size, len(b))
	}
	wantKeys(t, "List after overwrite", listKeys(t, st, ""), []string{"ow/key"})
}

func (s *suite) testGetRange(t *testing.T) {
	st := s.store(t)
	const size = 1000
	p := Pattern{Seed: 3}
	put(t, st, "range/obj", p.Bytes(0, size))
	cases := []struct {
		name        string
		off, length int64
		want        int64 // bytes expected from off
	}{
		{"start", 0, 10, 10},
		{"middle", 100, 50, 50},
		{"whole, length -1", 0, -1, size},
		{"tail, length -1", 500, -1, 500},
		{"exact end", 990, 10, 10},
		{"past end is cut short", 990, 100, 10},
		{"zero length", 10, 0, 0},
		{"off == size", size, 10, 0},
		{"off == size, length -1", size, -1, 0},
	}
	for _, c := range cases {
		got := getRange(t, st, "range/obj", c.off, c.length)
		wantBytes(t, fmt.Sprintf("GetRange %s (off %d, length %d)", c.name, c.off, c.length), got, p.Bytes(c.off, c.want))
	}
	for _, off := range []int64{size + 1, size + 1000} {
		rc, err := st.GetRange(context.Background(), "range/obj", off, 1)
		if err == nil {
			rc.Close()
		}
		wantErr(t, fmt.Sprintf("GetRange(off %d > size %d)", off, size), err, objectstore.ErrInvalidRange)
	}
	// Ranges of an empty object.
	put(t, st, "range/empty", nil)
	wantBytes(t, "GetRange(empty object, 0, -1)", getRange(t, st, "range/empty", 0, -1), nil)
	rc, err := st.GetRange(context.Background(), "range/empty", 1, -1)
	if err == nil {
		rc.Close()
	}
	wantErr(t, "GetRange(empty object, off 1)", err, objectstore.ErrInvalidRange)
}

func (s *suite) testStat(t *testing.T) {
	st := s.store(t)
	before := time.Now()
	put(t, st, "stat/a", Pattern{Seed: 4}.Bytes(0, 4321))
	put(t, st, "stat/empty", nil)
	for key, size := range map[string]int64{"stat/a": 4321, "stat/empty": 0} {
		info, err := st.Stat(context.Background(), key)
		if err != nil {
			t.Fatalf("Stat(%q): %v", key, err)
		}
		if info.Key != key || info.Size != size {
			t.Fatalf("Stat(%q) = {Key %q, Size %d}, want {Key %q, Size %d}", key, info.Key, info.Size, key, size)
		}
		// ModTime may be zero; otherwise it must be plausible (allowing an
		// hour of clock skew with a remote backend).
		if !info.ModTime.IsZero() && (info.ModTime.Before(before.Add(-time.Hour)) || info.ModTime.After(time.Now().Add(time.Hour))) {
			t.Fatalf("Stat(%q).ModTime = %v, not within an hour of the Put (%v)", key, info.ModTime, before)
		}
	}
	// List reports the same sizes.
	for _, oi := range listInfos(t, st, "stat/") {
		want := map[string]int64{"stat/a": 4321, "stat/empty": 0}[oi.Key]
		if oi.Size != want {
			t.Fatalf("List: %q has Size %d, want %d", oi.Key, oi.Size, want)
		}
	}
}

func (s *suite) testNotFound(t *testing.T) {
	st := s.store(t)
	wantNotFound(t, st, "nf/missing")
	put(t, st, "nf/dir/obj", []byte("x"))
	// Neither a prefix of an existing key nor an extension of it exists.
	wantNotFound(t, st, "nf/dir")
	wantNotFound(t, st, "nf")
	wantNotFound(t, st, "nf/dir/obj/more")
	wantNotFound(t, st, "nf/dir/ob")
}

func (s *suite) testDelete(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	put(t, st, "del/a/b/c", []byte("abc"))
	put(t, st, "del/keep", []byte("keep"))
	if err := st.Delete(ctx, "del/a/b/c"); err != nil {
		t.Fatalf("Delete(existing): %v", err)
	}
	wantNotFound(t, st, "del/a/b/c")
	wantKeys(t, "List after Delete", listKeys(t, st, ""), []string{"del/keep"})
	if err := st.Delete(ctx, "del/a/b/c"); err != nil {
		t.Fatalf("Delete(already deleted): %v, want nil", err)
	}
	if err := st.Delete(ctx, "del/never/existed"); err != nil {
		t.Fatalf("Delete(missing): %v, want nil", err)
	}
	// The key can be written again after a Delete, conditionally too.
	if err := st.Put(ctx, "del/a/b/c", strings.NewReader("new"), objectstore.PutOptions{IfNotExists: true, Size: 3}); err != nil {
		t.Fatalf("Put IfNotExists after Delete: %v", err)
	}
	wantBytes(t, "Get after re-create", get(t, st, "del/a/b/c"), []byte("new"))
}

var invalidKeys = []string{
	"", "/", "/a", "a/", "a//b", "./a", "a/./b", "a/..", "../a", ".", "..",
	"a\x00b", "a\nb", "tab\there", "del\x7f", "\xff\xfe", strings.Repeat("k", objectstore.MaxKeyLen+1),
}

func (s *suite) testInvalidKeys(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	for _, key := range invalidKeys {
		err := st.Put(ctx, key, strings.NewReader("x"), objectstore.PutOptions{Size: 1})
		wantErr(t, fmt.Sprintf("Put(%q)", key), err, objectstore.ErrInvalidKey)
		err = st.Put(ctx, key, strings.NewReader("x"), objectstore.PutOptions{Size: 1, IfNotExists: true})
		wantErr(t, fmt.Sprintf("Put(%q, IfNotExists)", key), err, objectstore.ErrInvalidKey)
		rc, err := st.Get(ctx, key)
		if err == nil {
			rc.Close()
		}
		wantErr(t, fmt.Sprintf("Get(%q)", key), err, objectstore.ErrInvalidKey)
		rc, err = st.GetRange(ctx, key, 0, 1)
		if err == nil {
			rc.Close()
		}
		wantErr(t, fmt.Sprintf("GetRange(%q)", key), err, objectstore.ErrInvalidKey)
		_, err = st.Stat(ctx, key)
		wantErr(t, fmt.Sprintf("Stat(%q)", key), err, objectstore.ErrInvalidKey)
		wantErr(t, fmt.Sprintf("Delete(%q)", key), st.Delete(ctx, key), objectstore.ErrInvalidKey)
	}
	if keys := listKeys(t, st, ""); len(keys) != 0 {
		t.Fatalf("Puts with invalid keys stored objects: %q", keys)
	}
}

// validKeys are unusual keys that every store must accept and keep apart.
func validKeys(maxLen int) []string {
	long := strings.Repeat("L", maxLen) // one segment of maxLen bytes
	// maxLen bytes in many one- or two-byte segments.
	segs := strings.Repeat("s/", (maxLen-1)/2) + "s"
	if maxLen%2 == 0 {
		segs = strings.Repeat("s/", maxLen/2-1) + "ss"
	}
	return []string{
		long,
		segs,
		strings.Repeat("%", maxLen),              // a file store that escapes '%' triples it
		strings.Repeat("🙂", maxLen/4),            // 4-byte runes
		strings.Repeat("%/", (maxLen-1)/2) + "%", // many one-byte segments
		strings.Repeat("é", 300) + "/x",          // a 600-byte segment of 2-byte runes
		"ключ/日本語/🙂",
		"with space/and+plus=eq&amp",
		"percent%/%25/%2F%", "percent%25", "percent",
		".tmp", ".tmp/x", "%tmp", "...", "a..b", ".hidden/.x",
		"tilde~", "a~/b", "bang!/q?", "star*", "back\\slash",
		"x.d/y", "x/y",
	}
}

func (s *suite) testValidKeys(t *testing.T) {
	st := s.store(t)
	keys := validKeys(s.opts.MaxKeyLen)
	for i, key := range keys {
		if err := objectstore.ValidateKey(key); err != nil || len(key) > s.opts.MaxKeyLen {
			t.Fatalf("suite bug: key of %d bytes: %v", len(key), err)
		}
		put(t, st, key, Pattern{Seed: uint64(100 + i)}.Bytes(0, int64(10+i)))
	}
	for i, key := range keys {
		wantBytes(t, fmt.Sprintf("Get(%q)", key), get(t, st, key), Pattern{Seed: uint64(100 + i)}.Bytes(0, int64(10+i)))
	}
	want := append([]string(nil), keys...)
	sort.Strings(want)
	wantKeys(t, "List of unusual keys", listKeys(t, st, ""), want)
	for _, key := range keys {
		if err := st.Delete(context.Background(), key); err != nil {
			t.Fatalf("Delete(%q): %v", key, err)
		}
	}
	if got := listKeys(t, st, ""); len(got) != 0 {
		t.Fatalf("List after deleting every key: %q", got)
	}
}

// testKeyIsAlsoPrefix checks the flat namespace: a key may be both an object
// and the directory-like prefix of other objects.
func (s *suite) testKeyIsAlsoPrefix(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	keys := []string{"p/x", "p/x/y", "p/x/y/z"}
	for _, k := range []string{"p/x/y/z", "p/x", "p/x/y"} { // deepest first, then its prefixes
		put(t, st, k, []byte(k))
	}
	for _, k := range keys {
		wantBytes(t, fmt.Sprintf("Get(%q)", k), get(t, st, k), []byte(k))
	}
	wantKeys(t, "List", listKeys(t, st, ""), keys)
	if err := st.Delete(ctx, "p/x/y"); err != nil {
		t.Fatalf("Delete(p/x/y): %v", err)
	}
	wantNotFound(t, st, "p/x/y")
	wantKeys(t, "List after deleting the middle key", listKeys(t, st, ""), []string{"p/x", "p/x/y/z"})
	if err := st.Delete(ctx, "p/x/y/z"); err != nil {
		t.Fatalf("Delete(p/x/y/z): %v", err)
	}
	wantBytes(t, "Get(p/x) after deleting the keys below it", get(t, st, "p/x"), []byte("p/x"))
	wantKeys(t, "List at the end", listKeys(t, st, ""), []string{"p/x"})
}

// orderKeys mix characters below and above '/' so that listing in
// directory-walk order differs from byte order of the full keys.
var orderKeys = []string{
	"a", "a!", "a-b", "a.b", "a/b", "a/b c", "a/b!", "a/b-c", "a/b.c", "a/b/c", "a/b/c/d",
	"a/b0", "a/ba", "a/bé", "a0", "a~", "aa", "b", "b/", "é", "z/z/z",
}

func (s *suite) testListOrder(t *testing.T) {
	st := s.store(t)
	var keys []string
	for _, k := range orderKeys {
		if objectstore.ValidateKey(k) == nil {
			keys = append(keys, k)
		}
	}
	// Put in reverse order so that insertion order does not help.
	for i := len(keys) - 1; i >= 0; i-- {
		put(t, st, keys[i], []byte(keys[i]))
	}
	sorted := append([]string(nil), keys...)
	sort.Strings(sorted)
	for _, prefix := range []string{"", "a", "a/", "a/b", "a/b/", "a/b/c", "a/b.", "a.", "b", "z/z", "é", "none", "a/bz"} {
		var want []string
		for _, k := range sorted {
			if strings.HasPrefix(k, prefix) {
				want = append(want, k)
			}
		}
		got := listKeys(t, st, prefix)
		wantKeys(t, fmt.Sprintf("List(%q) must give the keys with that prefix in ascending byte order", prefix), got, want)
	}
	for _, oi := range listInfos(t, st, "") {
		if oi.Size != int64(len(oi.Key)) {
			t.Fatalf("List: %q has Size %d, want %d", oi.Key, oi.Size, len(oi.Key))
		}
	}
}

var errStop = errors.New("storetest: stop listing")

func (s *suite) testListStopsOnError(t *testing.T) {
	st := s.store(t)
	for i := 0; i < 5; i++ {
		put(t, st, fmt.Sprintf("stop/%d", i), []byte{byte(i)})
	}
	var seen []string
	err := st.List(context.Background(), "stop/", func(oi objectstore.ObjectInfo) error {
		seen = append(seen, oi.Key)
		if len(seen) == 2 {
			return fmt.Errorf("wrapped: %w", errStop)
		}
		return nil
	})
	wantErr(t, "List whose callback fails", err, errStop)
	wantKeys(t, "keys seen before the callback failed", seen, []string{"stop/0", "stop/1"})
}

// parallel runs fn(i) for i in [0, n) on up to workers goroutines and
// returns the first error.
func parallel(n, workers int, fn func(i int) error) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan int)
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := fn(i); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < n; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return errors.Join(errs...)
}

func (s *suite) testListPagination(t *testing.T) {
	st := s.store(t)
	n := s.opts.ListCount
	ctx := context.Background()
	key := func(i int) string { return fmt.Sprintf("many/%06d", i) }
	err := parallel(n, s.opts.Parallel, func(i int) error {
		b := []byte(key(i))
		return st.Put(ctx, key(i), bytes.NewReader(b), objectstore.PutOptions{Size: int64(len(b))})
	})
	if err != nil {
		t.Fatalf("creating %d objects: %v", n, err)
	}
	// Neighbours that the prefix must exclude.
	put(t, st, "man", []byte("x"))
	put(t, st, "manz", []byte("x"))
	put(t, st, "many0", []byte("x"))

	got := listKeys(t, st, "many/")
	if len(got) != n {
		t.Fatalf("List(\"many/\") returned %d keys, want %d", len(got), n)
	}
	for i, k := range got {
		if k != key(i) {
			t.Fatalf("List(\"many/\")[%d] = %q, want %q (keys missing, repeated or out of order)", i, k, key(i))
		}
	}
	all := listKeys(t, st, "")
	if len(all) != n+3 || !sort.StringsAreSorted(all) {
		t.Fatalf("List(\"\") returned %d keys (sorted: %v), want %d in order", len(all), sort.StringsAreSorted(all), n+3)
	}
	// A prefix that selects a slice in the middle of the listing.
	if n > 1000 {
		sub := listKeys(t, st, "many/0010")
		if len(sub) != min(n-1000, 100) || sub[0] != key(1000) {
			t.Fatalf("List(\"many/0010\") = %d keys starting %q, want %d starting %q", len(sub), sub, min(n-1000, 100), key(1000))
		}
	}
}

func (s *suite) testConditionalCreate(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	first := []byte("first")
	if err := st.Put(ctx, "cc/key", bytes.NewReader(first), objectstore.PutOptions{IfNotExists: true, Size: 5}); err != nil {
		t.Fatalf("Put IfNotExists on a new key: %v", err)
	}
	err := st.Put(ctx, "cc/key", strings.NewReader("second"), objectstore.PutOptions{IfNotExists: true, Size: 6})
	wantErr(t, "Put IfNotExists on an existing key", err, objectstore.ErrExists)
	wantBytes(t, "Get after a lost conditional create", get(t, st, "cc/key"), first)
	// An unconditional Put still replaces it.
	put(t, st, "cc/key", []byte("third"))
	wantBytes(t, "Get after unconditional overwrite", get(t, st, "cc/key"), []byte("third"))
}

func (s *suite) testConditionalCreateRace(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	const rounds = 4
	const size = 64 << 10
	for round := 0; round < rounds; round++ {
		key := fmt.Sprintf("race/%d", round)
		errs := make([]error, s.opts.Racers)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r := Pattern{Seed: uint64(round*1000 + i)}.Reader(size)
				errs[i] = st.Put(ctx, key, r, objectstore.PutOptions{IfNotExists: true, Size: size})
			}()
		}
		close(start)
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: racers %d and %d both won a conditional create of %q", round, winner, i, key)
			case err == nil:
				winner = i
			case !errors.Is(err, objectstore.ErrExists):
				t.Fatalf("round %d: losing racer %d got %v, want ErrExists", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: none of %d racers won the conditional create of %q", round, len(errs), key)
		}
		wantBytes(t, fmt.Sprintf("round %d: Get returns the winner's (racer %d) bytes", round, winner),
			get(t, st, key), Pattern{Seed: uint64(round*1000 + winner)}.Bytes(0, size))
	}
}

func (s *suite) testConcurrentWriters(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	const writers, perWriter = 8, 8
	size := func(i int) int64 { return int64(i*997) % (256 << 10) }
	err := parallel(writers*perWriter, writers, func(i int) error {
		return st.Put(ctx, fmt.Sprintf("cw/%02d", i), Pattern{Seed: uint64(i)}.Reader(size(i)), objectstore.PutOptions{Size: -1})
	})
	if err != nil {
		t.Fatalf("concurrent Puts: %v", err)
	}
	// Read back concurrently too.
	err = parallel(writers*perWriter, writers, func(i int) error {
		key := fmt.Sprintf("cw/%02d", i)
		rc, err := st.Get(ctx, key)
		if err != nil {
			return err
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			return fmt.Errorf("reading %q: %w", key, err)
		}
		if !bytes.Equal(b, Pattern{Seed: uint64(i)}.Bytes(0, size(i))) {
			return fmt.Errorf("%q: wrong content (%d bytes, want %d)", key, len(b), size(i))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("concurrent Gets: %v", err)
	}
	if got := listKeys(t, st, "cw/"); len(got) != writers*perWriter {
		t.Fatalf("List after concurrent writes: %d keys, want %d", len(got), writers*perWriter)
	}
}

// failingReader yields n bytes of a pattern, then fails with err.
type failingReader struct {
	r   io.Reader
	err error
}

func newFailingReader(p Pattern, n int64, err error) *failingReader {
	return &failingReader{r: p.Reader(n), err: err}
}

func (f *failingReader) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if err == io.EOF {
		return n, f.err
	}
	return n, err
}

var errReader = errors.New("storetest: reader failed")

func (s *suite) testFailedPut(t *testing.T) {
	st := s.store(t)
	ctx := context.Background()
	for _, opts := range []objectstore.PutOptions{{Size: 1 << 20}, {Size: -1}, {Size: 1 << 20, IfNotExists: true}} {
		err := st.Put(ctx, "fail/new", newFailingReader(Pattern{Seed: 9}, 300<<10, errReader), opts)
		if err == nil {
			t.Fatalf("Put %+v whose reader fails after 300 KiB returned nil", opts)
		}
		wantErr(t, fmt.Sprintf("Put %+v whose reader fails", opts), err, errReader)
		wantNotFound(t, st, "fail/new")
	}
	old := []byte("the old bytes")
	put(t, st, "fail/existing", old)
	err := st.Put(ctx, "fail/existing", newFailingReader(Pattern{Seed: 9}, 300<<10, errReader), objectstore.PutOptions{Size: -1})
	wantErr(t, "failed overwrite", err, errReader)
	wantBytes(t, "Get after a failed overwrite keeps the old object", get(t, st, "fail/existing"), old)
	wantKeys(t, "List after failed Puts", listKeys(t, st, ""), []string{"fail/existing"})
	// A conditional create that failed does not block a later one.
	if err := st.Put(ctx, "fail/new", strings.NewReader("ok"), objectstore.PutOptions{IfNotExists: true, Size: 2}); err != nil {
		t.Fatalf("Put IfNotExists after a failed one: %v", err)
	}
}

// cancellingReader yields a pattern and cancels its context after
// cancelAfter bytes, then keeps yielding until size bytes: a store that does
// not watch its context would complete the Put.
type cancellingReader struct {
	r           io.Reader
	pos         int64
	cancelAfter int64
	cancel      context.CancelFunc
}

func (c *cancellingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.pos += int64(n)
	if c.pos >= c.cancelAfter {
		c.cancel()
	}
	return n, err
}

func (s *suite) testCancelPut(t *testing.T) {
	st := s.store(t)
	for _, opts := range []objectstore.PutOptions{{Size: 4 << 20}, {Size: -1}, {Size: 4 << 20, IfNotExists: true}} {
		ctx, cancel := context.WithCancel(context.Background())
		r := &cancellingReader{r: Pattern{Seed: 11}.Reader(4 << 20), cancelAfter: 256 << 10, cancel: cancel}
		err := st.Put(ctx, "cancel/obj", r, opts)
		cancel()
		wantErr(t, fmt.Sprintf("Put %+v cancelled mid-stream", opts), err, context.Canceled)
		wantNotFound(t, st, "cancel/obj")
	}
	if keys := listKeys(t, st, ""); len(keys) != 0 {
		t.Fatalf("cancelled Puts left objects: %q", keys)
	}
}

func (s *suite) testCancelledContext(t *testing.T) {
	st := s.store(t)
	put(t, st, "cctx/obj", []byte("data"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rc, err := st.Get(ctx, "cctx/obj")
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	wantErr(t, "Get (or reading it) with a cancelled context", err, context.Canceled)
	rc, err = st.GetRange(ctx, "cctx/obj", 1, 2)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	wantErr(t, "GetRange (or reading it) with a cancelled context", err, context.Canceled)
	_, err = st.Stat(ctx, "cctx/obj")
	wantErr(t, "Stat with a cancelled context", err, context.Canceled)
	err = st.List(ctx, "", func(objectstore.ObjectInfo) error { return nil })
	wantErr(t, "List with a cancelled context", err, context.Canceled)
	err = st.Put(ctx, "cctx/new", strings.NewReader("x"), objectstore.PutOptions{Size: 1})
	wantErr(t, "Put with a cancelled context", err, context.Canceled)
	wantNotFound(t, st, "cctx/new")
	err = st.Delete(ctx, "cctx/obj")
	wantErr(t, "Delete with a cancelled context", err, context.Canceled)

	// A reader obtained before the cancellation stops working after it.
	put(t, st, "cctx/big", Pattern{Seed: 12}.Bytes(0, 4<<20))
	ctx2, cancel2 := context.WithCancel(context.Background())
	rc, err = st.Get(ctx2, "cctx/big")
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	defer rc.Close()
	buf := make([]byte, 64<<10)
	if _, err := io.ReadFull(rc, buf); err != nil {
		t.Fatalf("reading the first 64 KiB: %v", err)
	}
	cancel2()
	if _, err := io.Copy(io.Discard, rc); err == nil {
		t.Fatalf("reading 4 MiB after the Get's context was cancelled succeeded; want an error matching context.Canceled")
	} else {
		wantErr(t, "reading after the Get's context was cancelled", err, context.Canceled)
	}
}

func (s *suite) testClose(t *testing.T) {
	st := s.openRaw(t)
	ctx := context.Background()
	put(t, st, "close/obj", []byte("x"))
	if err := st.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	check := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s after Close returned nil, want an error", what)
		}
		if s.opts.StrictClose && !errors.Is(err, objectstore.ErrClosed) {
			t.Fatalf("%s after Close: got %v, want ErrClosed", what, err)
		}
	}
	check("Put", st.Put(ctx, "close/new", strings.NewReader("x"), objectstore.PutOptions{Size: 1}))
	rc, err := st.Get(ctx, "close/obj")
	if err == nil {
		rc.Close()
	}
	check("Get", err)
	rc, err = st.GetRange(ctx, "close/obj", 0, 1)
	if err == nil {
		rc.Close()
	}
	check("GetRange", err)
	_, err = st.Stat(ctx, "close/obj")
	check("Stat", err)
	check("List", st.List(ctx, "", func(objectstore.ObjectInfo) error { return nil }))
	check("Delete", st.Delete(ctx, "close/obj"))
}
