package faulty_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

var policy = objectstore.RetryPolicy{MaxAttempts: 5, InitialBackoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond}

// stack is retry over faulty over memory.
func stack(t *testing.T, rules ...faulty.Rule) (objectstore.Store, *faulty.Store, *objectstore.Memory) {
	mem := objectstore.NewMemory()
	f := faulty.New(mem, faulty.Config{Seed: 1, Rules: rules})
	s := objectstore.WithRetry(f, policy, zerolog.Nop())
	t.Cleanup(func() { s.Close() })
	return s, f, mem
}

func data(seed uint64, n int64) []byte { return storetest.Pattern{Seed: seed}.Bytes(0, n) }

func read(t *testing.T, s objectstore.Store, key string) []byte {
	t.Helper()
	rc, err := s.Get(context.Background(), key)
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

// onlyReader hides every method but Read (so it is not an io.Seeker).
type onlyReader struct{ io.Reader }

func TestTransientPutCallIsRetried(t *testing.T) {
	s, f, _ := stack(t, faulty.Rule{Ops: faulty.OpPut, Fault: faulty.FailCall, Transient: true, Times: 3})
	want := data(1, 10000)
	// Not seekable, but the failures happen before any byte is read.
	if err := s.Put(context.Background(), "k", onlyReader{bytes.NewReader(want)}, objectstore.PutOptions{Size: -1}); err != nil {
		t.Fatalf("Put with 3 transient failures and 5 attempts: %v", err)
	}
	if f.Fired() != 3 {
		t.Fatalf("faults fired: %d, want 3", f.Fired())
	}
	if !bytes.Equal(read(t, s, "k"), want) {
		t.Fatal("wrong content after a retried Put")
	}
}

func TestTransientPutMidStreamIsRetriedWhenSeekable(t *testing.T) {
	s, f, _ := stack(t, faulty.Rule{Ops: faulty.OpPut, Fault: faulty.FailStream, After: 4000, Transient: true, Times: 2})
	want := data(2, 100000)
	r := bytes.NewReader(want)
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(context.Background(), "k", r, objectstore.PutOptions{Size: int64(len(want))}); err != nil {
		t.Fatalf("Put of a seekable reader with 2 mid-stream transient failures: %v", err)
	}
	if f.Fired() != 2 {
		t.Fatalf("faults fired: %d, want 2", f.Fired())
	}
	if got := read(t, s, "k"); !bytes.Equal(got, want) {
		t.Fatalf("wrong content after a retried Put: %d bytes, want %d", len(got), len(want))
	}
}

func TestTransientPutMidStreamNotSeekableIsReturned(t *testing.T) {
	s, f, mem := stack(t, faulty.Rule{Ops: faulty.OpPut, Fault: faulty.FailStream, After: 4000, Transient: true, Times: 1})
	err := s.Put(context.Background(), "k", onlyReader{bytes.NewReader(data(3, 100000))}, objectstore.PutOptions{Size: 100000})
	if !objectstore.IsTransient(err) || !errors.Is(err, faulty.ErrInjected) {
		t.Fatalf("Put of a non-seekable reader failing mid-stream: %v, want the transient injected error", err)
	}
	if f.Fired() != 1 {
		t.Fatalf("faults fired: %d, want 1 (no retry)", f.Fired())
	}
	if _, err := mem.Stat(context.Background(), "k"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("a failed Put left something: Stat = %v", err)
	}
}

func TestPermanentErrorsSurfaceUnchanged(t *testing.T) {
	errDisk := errors.New("disk on fire")
	ctx := context.Background()
	for _, op := range []faulty.Op{faulty.OpPut, faulty.OpGet, faulty.OpGetRange, faulty.OpStat, faulty.OpList, faulty.OpDelete} {
		t.Run(op.String(), func(t *testing.T) {
			s, f, mem := stack(t)
			if err := mem.Put(ctx, "k", bytes.NewReader([]byte("v")), objectstore.PutOptions{Size: 1}); err != nil {
				t.Fatal(err)
			}
			f.Add(faulty.Rule{Ops: op, Fault: faulty.FailCall, Err: errDisk})
			var err error
			switch op {
			case faulty.OpPut:
				err = s.Put(ctx, "k2", bytes.NewReader([]byte("v")), objectstore.PutOptions{Size: 1})
			case faulty.OpGet:
				_, err = s.Get(ctx, "k")
			case faulty.OpGetRange:
				_, err = s.GetRange(ctx, "k", 0, 1)
			case faulty.OpStat:
				_, err = s.Stat(ctx, "k")
			case faulty.OpList:
				err = s.List(ctx, "", func(objectstore.ObjectInfo) error { return nil })
			case faulty.OpDelete:
				err = s.Delete(ctx, "k")
			}
			if !errors.Is(err, errDisk) || objectstore.IsTransient(err) {
				t.Fatalf("%v: got %v, want the permanent error", op, err)
			}
			if f.Fired() != 1 {
				t.Fatalf("%v: %d attempts, want 1: permanent errors must not be retried", op, f.Fired())
			}
		})
	}
}

func TestTransientErrorsAreRetriedOnEveryOp(t *testing.T) {
	ctx := context.Background()
	mem := objectstore.NewMemory()
	f := faulty.New(mem, faulty.Config{Seed: 3})
	// Half the calls fail: allow enough attempts that giving up is unlikely
	// (0.5^29).
	s := objectstore.WithRetry(f, objectstore.RetryPolicy{MaxAttempts: 30, InitialBackoff: time.Microsecond, MaxBackoff: time.Millisecond, ResumeReads: true}, zerolog.Nop())
	for i := 0; i < 10; i++ {
		if err := mem.Put(ctx, fmt.Sprintf("k%d", i), bytes.NewReader(data(uint64(i), 50000)), objectstore.PutOptions{Size: 50000}); err != nil {
			t.Fatal(err)
		}
	}
	f.Add(faulty.Rule{Fault: faulty.FailCall, Transient: true, Probability: 0.5})
	f.Add(faulty.Rule{Ops: faulty.OpGet | faulty.OpGetRange, Fault: faulty.FailStream, After: 7000, Transient: true, Probability: 0.5})
	f.Add(faulty.Rule{Ops: faulty.OpList, Fault: faulty.FailStream, After: 4, Transient: true, Times: 2})
	for i := 0; i < 10; i++ {
		key := fmt.Sprintf("k%d", i)
		if got := read(t, s, key); !bytes.Equal(got, data(uint64(i), 50000)) {
			t.Fatalf("Get(%q) through failures: wrong bytes", key)
		}
		rc, err := s.GetRange(ctx, key, 1000, 20000)
		if err != nil {
			t.Fatalf("GetRange: %v", err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data(uint64(i), 21000)[1000:]) {
			t.Fatalf("GetRange(%q) through failures: %d bytes, %v", key, len(got), err)
		}
		if info, err := s.Stat(ctx, key); err != nil || info.Size != 50000 {
			t.Fatalf("Stat(%q): %+v, %v", key, info, err)
		}
	}
	var keys []string
	if err := s.List(ctx, "", func(oi objectstore.ObjectInfo) error { keys = append(keys, oi.Key); return nil }); err != nil {
		t.Fatalf("List: %v", err)
	}
	if fmt.Sprint(keys) != "[k0 k1 k2 k3 k4 k5 k6 k7 k8 k9]" {
		t.Fatalf("List through failures saw %q: keys lost or repeated", keys)
	}
	for i := 0; i < 10; i++ {
		if err := s.Delete(ctx, fmt.Sprintf("k%d", i)); err != nil {
			t.Fatalf("Delete: %v", err)
		}
	}
	if f.Fired() < 10 {
		t.Fatalf("only %d faults injected", f.Fired())
	}
}

func TestRetryGivesUp(t *testing.T) {
	s, f, _ := stack(t, faulty.Rule{Ops: faulty.OpStat, Fault: faulty.FailCall, Transient: true})
	_, err := s.Stat(context.Background(), "k")
	if !objectstore.IsTransient(err) || !errors.Is(err, faulty.ErrInjected) {
		t.Fatalf("Stat failing forever: %v, want the transient error", err)
	}
	if f.Fired() != policy.MaxAttempts {
		t.Fatalf("%d attempts, want MaxAttempts = %d", f.Fired(), policy.MaxAttempts)
	}
}

func TestRetryMaxElapsed(t *testing.T) {
	mem := objectstore.NewMemory()
	f := faulty.New(mem, faulty.Config{Rules: []faulty.Rule{{Fault: faulty.FailCall, Transient: true}}})
	s := objectstore.WithRetry(f, objectstore.RetryPolicy{MaxAttempts: 1000, InitialBackoff: 20 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, MaxElapsed: 200 * time.Millisecond}, zerolog.Nop())
	start := time.Now()
	_, err := s.Stat(context.Background(), "k")
	if el := time.Since(start); !objectstore.IsTransient(err) || el > 2*time.Second {
		t.Fatalf("Stat: %v after %v, want a transient error within about 200ms", err, el)
	}
	if n := f.Fired(); n < 3 || n > 25 {
		t.Fatalf("%d attempts in 200ms with 10-20ms backoff", n)
	}
}

func TestRetryHonoursCancellation(t *testing.T) {
	mem := objectstore.NewMemory()
	f := faulty.New(mem, faulty.Config{Rules: []faulty.Rule{{Fault: faulty.FailCall, Transient: true}}})
	s := objectstore.WithRetry(f, objectstore.RetryPolicy{MaxAttempts: 100, InitialBackoff: time.Hour, MaxElapsed: -1}, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := s.Stat(ctx, "k")
	if !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("Stat cancelled while backing off: %v after %v, want context.Canceled at once", err, time.Since(start))
	}
}

func TestLatency(t *testing.T) {
	mem := objectstore.NewMemory()
	f := faulty.New(mem, faulty.Config{Rules: []faulty.Rule{{Ops: faulty.OpStat, Fault: faulty.Delay, Latency: 60 * time.Millisecond, Times: 1}}})
	start := time.Now()
	if _, err := f.Stat(context.Background(), "k"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatal(err)
	}
	if el := time.Since(start); el < 60*time.Millisecond {
		t.Fatalf("delayed Stat took %v, want at least 60ms", el)
	}
	f.Stat(context.Background(), "k")
	if n := f.Fired(); n != 1 {
		t.Fatalf("the rule had Times 1 but fired %d times", n)
	}
	// A delay ends with the context.
	f.Add(faulty.Rule{Fault: faulty.Delay, Latency: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := f.Stat(ctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("delayed Stat with a 30ms deadline: %v", err)
	}
}

func TestDeterministicWithSeed(t *testing.T) {
	pattern := func(seed uint64) string {
		f := faulty.New(objectstore.NewMemory(), faulty.Config{Seed: seed, Rules: []faulty.Rule{{Fault: faulty.FailCall, Probability: 0.5}}})
		out := ""
		for i := 0; i < 64; i++ {
			if _, err := f.Stat(context.Background(), "k"); errors.Is(err, faulty.ErrInjected) {
				out += "x"
			} else {
				out += "."
			}
		}
		return out
	}
	a, b, c := pattern(7), pattern(7), pattern(8)
	if a != b {
		t.Fatalf("same seed, different faults:\n%s\n%s", a, b)
	}
	if a == c {
		t.Fatalf("seeds 7 and 8 gave the same 64 faults: %s", a)
	}
}

// TestNothingHalfWrittenIsVisible races readers against writers whose
// uploads fail mid-stream (transiently, permanently, on seekable and
// non-seekable readers) through the retry wrapper: a reader sees
// ErrNotFound or a complete object, never a prefix.
func TestNothingHalfWrittenIsVisible(t *testing.T) {
	s, f, _ := stack(t,
		faulty.Rule{Ops: faulty.OpPut, Fault: faulty.FailStream, After: 10000, Transient: true, Probability: 0.4},
		faulty.Rule{Ops: faulty.OpPut, Fault: faulty.FailStream, After: 20000, Err: errors.New("permanent"), Probability: 0.2},
	)
	const keys, size = 8, 64 << 10
	// Every version of a key is a full pattern of size bytes whose seed is
	// in its first 8 bytes, so a reader can check it is complete.
	version := func(seed uint64) []byte {
		b := data(seed, size)
		for i := 0; i < 8; i++ {
			b[i] = byte(seed >> (8 * i))
		}
		return b
	}
	complete := func(b []byte) bool {
		if len(b) != size {
			return false
		}
		var seed uint64
		for i := 0; i < 8; i++ {
			seed |= uint64(b[i]) << (8 * i)
		}
		return bytes.Equal(b, version(seed))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var (
		wg                      sync.WaitGroup
		puts, failed, notFound  atomic.Int64
		reads, torn, readErrors atomic.Int64
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint64(0); ctx.Err() == nil; i++ {
				seed := uint64(w)<<32 | i
				var r io.Reader = bytes.NewReader(version(seed))
				if i%2 == 1 {
					r = onlyReader{r}
				}
				if err := s.Put(ctx, fmt.Sprintf("obj/%d", seed%keys), r, objectstore.PutOptions{Size: size}); err != nil {
					failed.Add(1)
				} else {
					puts.Add(1)
				}
			}
		}()
	}
	for rd := 0; rd < 4; rd++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				rc, err := s.Get(ctx, fmt.Sprintf("obj/%d", i%keys))
				if errors.Is(err, objectstore.ErrNotFound) {
					notFound.Add(1)
					continue
				}
				if err != nil {
					if ctx.Err() == nil {
						readErrors.Add(1)
					}
					continue
				}
				b, err := io.ReadAll(rc)
				rc.Close()
				if err != nil {
					continue
				}
				reads.Add(1)
				if !complete(b) {
					torn.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("puts ok %d, failed %d; reads %d complete, %d not found; %d faults", puts.Load(), failed.Load(), reads.Load(), notFound.Load(), f.Fired())
	if torn.Load() != 0 {
		t.Fatalf("%d reads saw an incomplete object", torn.Load())
	}
	if readErrors.Load() != 0 {
		t.Fatalf("%d Gets failed with an error other than ErrNotFound", readErrors.Load())
	}
	if puts.Load() == 0 || failed.Load() == 0 || reads.Load() == 0 || f.Fired() == 0 {
		t.Fatal("the test did not exercise both failing and succeeding puts with readers")
	}
}

func TestFaultyAcceptanceWithoutRules(t *testing.T) {
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		return faulty.New(objectstore.NewMemory(), faulty.Config{})
	}, storetest.Options{StrictClose: true, BigSize: 8 << 20})
}

func TestMidStreamReadFailureWithoutResume(t *testing.T) {
	ctx := context.Background()
	s, f, mem := stack(t) // policy without ResumeReads
	if err := mem.Put(ctx, "k", bytes.NewReader(data(1, 50000)), objectstore.PutOptions{Size: 50000}); err != nil {
		t.Fatal(err)
	}
	f.Add(faulty.Rule{Ops: faulty.OpGet, Fault: faulty.FailStream, After: 7000, Transient: true, Times: 1})
	rc, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if !objectstore.IsTransient(err) || len(b) != 7000 {
		t.Fatalf("read %d bytes, error %v; want 7000 bytes then the transient error", len(b), err)
	}
}

// TestFailReply: the wrapped store has done the Put or Delete when the
// call fails; a retried conditional create then finds its own object
// (ErrExists), as the retry wrapper documents.
func TestFailReply(t *testing.T) {
	ctx := context.Background()
	s, f, mem := stack(t, faulty.Rule{Ops: faulty.OpPut, Fault: faulty.FailReply, Transient: true, Times: 1},
		faulty.Rule{Ops: faulty.OpDelete, Fault: faulty.FailReply, Transient: true, Times: 1})
	want := data(2, 5000)
	err := s.Put(ctx, "k", bytes.NewReader(want), objectstore.PutOptions{IfNotExists: true, Size: int64(len(want))})
	if !errors.Is(err, objectstore.ErrExists) || f.Fired() != 1 {
		t.Fatalf("conditional create whose reply was lost, retried: %v (%d faults); want ErrExists", err, f.Fired())
	}
	if got := read(t, mem, "k"); !bytes.Equal(got, want) {
		t.Fatal("the create did not reach the store")
	}
	if err := s.Delete(ctx, "k"); err != nil || f.Fired() != 2 {
		t.Fatalf("delete whose reply was lost, retried: %v (%d faults); want success", err, f.Fired())
	}
	if _, err := mem.Stat(ctx, "k"); !errors.Is(err, objectstore.ErrNotFound) {
		t.Fatalf("after the delete: %v", err)
	}
}
