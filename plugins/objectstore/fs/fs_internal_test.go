package fs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

func TestRelPath(t *testing.T) {
	long := strings.Repeat("x", 500)
	cases := []struct{ key, want string }{
		{"layers/000001", "layers%/000001"},
		{"a", "a"},
		{"a/b/c", "a%/b%/c"},
		{"100%/x%y", "100%25%/x%25y"},
		{".tmp/%tmp", ".tmp%/%25tmp"},
		{long, strings.Repeat("x", 240) + "%+/" + strings.Repeat("x", 240) + "%+/" + strings.Repeat("x", 20)},
		{long + "/z", strings.Repeat("x", 240) + "%+/" + strings.Repeat("x", 240) + "%+/" + strings.Repeat("x", 20) + "%/z"},
		// The last piece of a cut segment is never "." or "..".
		{strings.Repeat("y", 241), strings.Repeat("y", 237) + "%+/yyyy"},
		{strings.Repeat("y", 240) + ".", strings.Repeat("y", 237) + "%+/yyy."},
	}
	for _, c := range cases {
		if got := relPath(c.key); got != c.want {
			t.Errorf("relPath(%q)\n got  %q\n want %q", c.key, got, c.want)
		}
		for _, name := range strings.Split(relPath(c.key), "/") {
			if len(name) > 255 || name == "." || name == ".." || name == "" {
				t.Errorf("relPath(%q) has the bad name %q", c.key, name)
			}
		}
	}
}

func TestUnescapeRejectsForeignNames(t *testing.T) {
	for _, esc := range []string{"%", "%2", "%tmp", "a%2Fb", "x%"} {
		if _, ok := unescape(esc); ok {
			t.Errorf("unescape(%q) accepted a name no key produces", esc)
		}
	}
	for _, s := range []string{"", "a", "%", "%%", "%25", "a%b%"} {
		if got, ok := unescape(escapeSegment(s)); !ok || got != s {
			t.Errorf("unescape(escape(%q)) = %q, %v", s, got, ok)
		}
	}
}

func put(t *testing.T, s objectstore.Store, key, data string) {
	t.Helper()
	if err := s.Put(context.Background(), key, strings.NewReader(data), objectstore.PutOptions{Size: int64(len(data))}); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func keys(t *testing.T, s objectstore.Store, prefix string) []string {
	t.Helper()
	var out []string
	if err := s.List(context.Background(), prefix, func(oi objectstore.ObjectInfo) error {
		out = append(out, oi.Key)
		return nil
	}); err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return out
}

func TestObjectsAreFilesUnderRoot(t *testing.T) {
	s := open(t, Config{})
	defer s.Close()
	put(t, s, "layers/t1/000001", "layer")
	file := filepath.Join(s.Root(), "layers%", "t1%", "000001")
	b, err := os.ReadFile(file)
	if err != nil || string(b) != "layer" {
		t.Fatalf("object file: %q, %v", b, err)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("object file mode: %v, %v; want 0644", st.Mode(), err)
	}
	// Delete removes the directories it empties, but not Root.
	put(t, s, "layers/t2/x", "x")
	if err := s.Delete(context.Background(), "layers/t1/000001"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(s.Root(), "layers%", "t1%")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty directory left after Delete: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.Root(), "layers%", "t2%", "x")); err != nil {
		t.Fatalf("a sibling was removed: %v", err)
	}
	if err := s.Delete(context.Background(), "layers/t2/x"); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(s.Root())
	if err != nil {
		t.Fatalf("Root removed: %v", err)
	}
	for _, e := range entries {
		if e.Name() != tmpDirNam {
			t.Fatalf("Root holds %q after every object was deleted", e.Name())
		}
	}
}

func TestErrorsNameThePath(t *testing.T) {
	s := open(t, Config{})
	defer s.Close()
	_, err := s.Stat(context.Background(), "no/such")
	if !errors.Is(err, objectstore.ErrNotFound) || !strings.Contains(err.Error(), filepath.Join(s.Root(), "no%", "such")) {
		t.Fatalf("Stat error %q should match ErrNotFound and name the path", err)
	}
}

func TestForeignFilesAreIgnored(t *testing.T) {
	s := open(t, Config{})
	defer s.Close()
	put(t, s, "a/b", "x")
	// Names that no key produces, dropped in by hand.
	for _, name := range []string{"bad%x", "a%/junk%", "a%/%2"} {
		if err := os.WriteFile(filepath.Join(s.Root(), name), []byte("?"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := keys(t, s, ""); fmt.Sprint(got) != "[a/b]" {
		t.Fatalf("List with foreign files = %q, want [a/b]", got)
	}
}

// blockingReader yields first, then blocks until release is closed, then
// yields rest.
type blockingReader struct {
	first, rest []byte
	started     chan struct{}
	release     chan struct{}
	once        sync.Once
}

func (b *blockingReader) Read(p []byte) (int, error) {
	if len(b.first) > 0 {
		n := copy(p, b.first)
		b.first = b.first[n:]
		return n, nil
	}
	b.once.Do(func() { close(b.started) })
	<-b.release
	if len(b.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, b.rest)
	b.rest = b.rest[n:]
	return n, nil
}

func newBlockingReader(data []byte, split int) *blockingReader {
	return &blockingReader{first: data[:split], rest: data[split:], started: make(chan struct{}), release: make(chan struct{})}
}

func tmpFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(filepath.Join(root, tmpDirNam), func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() && !strings.HasSuffix(path, ".lock") {
			out = append(out, path)
		}
		return nil
	})
	return out
}

// TestInFlightPutInvisible: while a Put is half-way, its bytes are in a
// temporary file that neither Get nor List sees; a second Store opened on
// the same root meanwhile does not remove it; the Put then completes.
func TestInFlightPutInvisible(t *testing.T) {
	root := t.TempDir()
	a := open(t, Config{Root: root})
	defer a.Close()
	data := storetest.Pattern{Seed: 5}.Bytes(0, 1<<20)
	br := newBlockingReader(data, 300<<10)
	done := make(chan error, 1)
	go func() { done <- a.Put(context.Background(), "obj", br, objectstore.PutOptions{Size: int64(len(data))}) }()
	<-br.started
	if got := keys(t, a, ""); len(got) != 0 {
		t.Fatalf("List during a Put shows %q", got)
	}
	if _, err := a.Stat(context.Background(), "obj"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("Stat during a Put: %v", err)
	}
	if tf := tmpFiles(t, root); len(tf) != 1 {
		t.Fatalf("temporary files during a Put: %q, want one", tf)
	}
	b := open(t, Config{Root: root}) // runs the stale-file cleanup
	if tf := tmpFiles(t, root); len(tf) != 1 {
		t.Fatalf("opening a second store removed the live temporary file: %q", tf)
	}
	if got := keys(t, b, ""); len(got) != 0 {
		t.Fatalf("second store lists %q during the Put", got)
	}
	close(br.release)
	if err := <-done; err != nil {
		t.Fatalf("Put: %v", err)
	}
	// The second store sees the object at once.
	rc, err := b.Get(context.Background(), "obj")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("second store reads different bytes")
	}
	if tf := tmpFiles(t, root); len(tf) != 0 {
		t.Fatalf("temporary files left after the Put: %q", tf)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// Closing removes the store's own area.
	entries, _ := os.ReadDir(filepath.Join(root, tmpDirNam))
	if len(entries) != 2 { // a's lock file and directory
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("temporary area after closing one of two stores: %q, want a's lock and directory", names)
	}
}

// TestStaleTempFilesRemoved simulates a process that crashed mid-Put.
func TestStaleTempFilesRemoved(t *testing.T) {
	root := t.TempDir()
	base := filepath.Join(root, tmpDirNam)
	for _, p := range []string{"dead", "orphan"} {
		if err := os.MkdirAll(filepath.Join(base, p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(base, p, "put-123"), []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// "dead" has a lock file nobody holds; "orphan" has none.
	if err := os.WriteFile(filepath.Join(base, "dead.lock"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s := open(t, Config{Root: root})
	defer s.Close()
	for _, p := range []string{"dead", "dead.lock", "orphan"} {
		if _, err := os.Stat(filepath.Join(base, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stale %s not removed: %v", p, err)
		}
	}
	if got := keys(t, s, ""); len(got) != 0 {
		t.Fatalf("List shows temporary files: %q", got)
	}
}

// TestStoresOpenTogether: Stores opened at the same moment on one root
// (three safekeepers archiving to one folder, started together) all open:
// one Store's sweep of stale areas may take the lock of another's brand-new
// lock file before its owner does, and the owner then starts again instead
// of failing with "resource temporarily unavailable".
func TestStoresOpenTogether(t *testing.T) {
	root := t.TempDir()
	base := filepath.Join(root, tmpDirNam)
	for round := 0; round < 200; round++ {
		var wg sync.WaitGroup
		areas := make([]*tmpArea, 8)
		errs := make([]error, 8)
		for i := range areas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				areas[i], _, errs[i] = openTmpArea(base)
			}()
		}
		wg.Wait()
		for i, a := range areas {
			if errs[i] != nil {
				t.Fatalf("round %d: store %d: %v", round, i, errs[i])
			}
			if _, err := os.Stat(a.dir); err != nil {
				t.Fatalf("round %d: store %d: its area: %v", round, i, err)
			}
		}
		for _, a := range areas {
			if err := a.close(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestCleanOutdatedListing: a listing that holds a live area's directory
// but not its lock file (readdir returned the directory, created after
// the lock, and not the lock; ext4 lists a small directory in hash order,
// and a second getdents call returns only names hashed after the first
// call's last) must not remove the area. TestStoresOpenTogether failed so
// once in CI.
func TestCleanOutdatedListing(t *testing.T) {
	base := t.TempDir()
	a, _, err := openTmpArea(base)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	entries, err := os.ReadDir(base)
	if err != nil {
		t.Fatal(err)
	}
	var listed []iofs.DirEntry
	for _, e := range entries {
		if e.IsDir() {
			listed = append(listed, e) // the lock file left out
		}
	}
	if len(listed) != 1 {
		t.Fatalf("listing: %v", entries)
	}
	if n, err := cleanListed(base, listed); n != 0 || err != nil {
		t.Fatalf("cleaned %d areas, %v", n, err)
	}
	if _, err := os.Stat(a.dir); err != nil {
		t.Fatalf("the live area went: %v", err)
	}
}

func TestConditionalCreateRaceAcrossStores(t *testing.T) {
	root := t.TempDir()
	var stores []*Store
	for i := 0; i < 4; i++ {
		s := open(t, Config{Root: root})
		defer s.Close()
		stores = append(stores, s)
	}
	for round := 0; round < 20; round++ {
		key := fmt.Sprintf("r/%d", round)
		var wg sync.WaitGroup
		errs := make([]error, 16)
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = stores[i%4].Put(context.Background(), key, strings.NewReader(fmt.Sprint(i)), objectstore.PutOptions{IfNotExists: true, Size: -1})
			}()
		}
		wg.Wait()
		winners := 0
		for _, err := range errs {
			if err == nil {
				winners++
			} else if !errors.Is(err, objectstore.ErrExists) {
				t.Fatalf("loser: %v", err)
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d winners", round, winners)
		}
	}
}

// TestPutDeleteRace: Deletes that remove empty directories race Puts that
// need them; every Put must still succeed. Two Stores share the root, as
// two processes would: their Puts and Deletes are not serialized by a lock.
func TestPutDeleteRace(t *testing.T) {
	root := t.TempDir()
	stores := []*Store{open(t, Config{Root: root, NoSync: true}), open(t, Config{Root: root, NoSync: true})}
	defer stores[0].Close()
	defer stores[1].Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := stores[w%2]
			for i := 0; i < 100; i++ {
				key := fmt.Sprintf("d/e/f/%d-%d", w, i)
				if err := s.Put(ctx, key, strings.NewReader("x"), objectstore.PutOptions{Size: 1}); err != nil {
					errs <- err
					return
				}
				if err := s.Delete(ctx, key); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestConfig(t *testing.T) {
	if err := (Config{}).Validate(); err == nil {
		t.Fatal("empty root accepted")
	}
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	if _, err := New(Config{Root: file}, zerolog.Nop()); err == nil {
		t.Fatal("New on a regular file succeeded")
	}
	// A relative root is made absolute.
	dir := t.TempDir()
	t.Chdir(dir)
	s, err := New(Config{Root: "rel/objects"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if want := filepath.Join(dir, "rel", "objects"); s.Root() != want {
		t.Fatalf("Root() = %q, want %q", s.Root(), want)
	}
}

func TestListSortedAcrossCutSegments(t *testing.T) {
	s := open(t, Config{NoSync: true})
	defer s.Close()
	base := strings.Repeat("p", 240) // exactly one piece; longer keys are cut after it
	ks := []string{base, base + "!", base + "/x", base + "a", base + "a/b", base + ".", base + "%", base + strings.Repeat("q", 300)}
	for _, k := range ks {
		put(t, s, k, k)
	}
	sort.Strings(ks)
	if got := keys(t, s, ""); fmt.Sprint(got) != fmt.Sprint(ks) {
		t.Fatalf("List:\n got  %q\n want %q", got, ks)
	}
	if got := keys(t, s, base+"a"); fmt.Sprint(got) != fmt.Sprint([]string{base + "a", base + "a/b"}) {
		t.Fatalf("List(base+a) = %q", got)
	}
}
