package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/rs/zerolog"
)

// RetryPolicy says how WithRetry repeats calls that fail with ErrTransient.
// Zero fields take the values of DefaultRetryPolicy.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts of one call, the first
	// included; 1 disables retries.
	MaxAttempts int
	// InitialBackoff is the wait before the second attempt; each later wait
	// is Multiplier times longer, up to MaxBackoff. Every wait is jittered:
	// a uniform random duration between half of it and all of it.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	Multiplier     float64
	// MaxElapsed bounds the time spent on one call: no retry starts after
	// it (a negative value means no bound).
	MaxElapsed time.Duration
	// ResumeReads makes a reader returned by Get or GetRange that fails
	// transiently in the middle of the stream reopen the object at the next
	// byte (with GetRange) instead of returning the error. It is only safe
	// for objects that are never overwritten, as strata's are: if the key
	// was replaced in between, the reader would return the start of one
	// version and the end of another. Off by default.
	ResumeReads bool
}

// DefaultRetryPolicy: 6 attempts, 100 ms doubling to at most 5 s, within
// 30 s.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{MaxAttempts: 6, InitialBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second, Multiplier: 2, MaxElapsed: 30 * time.Second}
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	d := DefaultRetryPolicy()
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = d.MaxAttempts
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = d.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = max(d.MaxBackoff, p.InitialBackoff)
	}
	if p.Multiplier < 1 {
		p.Multiplier = d.Multiplier
	}
	if p.MaxElapsed == 0 {
		p.MaxElapsed = d.MaxElapsed
	}
	return p
}

// WithRetry returns a Store that repeats the calls to s that fail with an
// error matching ErrTransient, with exponential backoff and jitter, within
// the attempts and time of p. Other errors, and the error of the last
// attempt, are returned unchanged (still matching ErrTransient when they
// did). A cancelled context stops the waiting at once and returns an error
// matching ctx.Err().
//
// What is retried:
//   - Put, when r is also an io.Seeker: before each new attempt r is sought
//     back to where it was when Put was called. When r cannot seek, a
//     transient failure is retried only if the failed attempt read nothing
//     from r; otherwise it is returned as is, since the bytes consumed
//     cannot be read again. Callers that need retried uploads pass a
//     *os.File, *bytes.Reader, *strings.Reader or *io.SectionReader. A
//     retried conditional create (IfNotExists) whose earlier attempt did
//     reach the backend before failing transiently reports ErrExists.
//   - Get and GetRange; failures of the returned reader in the middle of
//     the stream only with p.ResumeReads (see there).
//   - Stat and Delete.
//   - List, resuming after the last key passed to fn, so fn never sees a
//     key twice. An error returned by fn is never retried.
//
// Closing the returned store closes s.
func WithRetry(s Store, p RetryPolicy, log zerolog.Logger) Store {
	return &retryStore{s: s, p: p.withDefaults(), log: log}
}

type retryStore struct {
	s   Store
	p   RetryPolicy
	log zerolog.Logger
}

var _ Store = (*retryStore)(nil)

// do calls fn until it succeeds, fails with a non-transient error, or the
// policy is exhausted. canRetry, when not nil, is asked before each retry.
func (rs *retryStore) do(ctx context.Context, op, key string, canRetry func() bool, fn func() error) error {
	start := time.Now()
	err := fn()
	if err == nil || !IsTransient(err) {
		return err
	}
	return rs.retryAfter(ctx, op, key, err, start, canRetry, fn)
}

// retryAfter continues a call whose first attempt, started at start, failed
// with the transient error err.
func (rs *retryStore) retryAfter(ctx context.Context, op, key string, err error, start time.Time, canRetry func() bool, fn func() error) error {
	backoff := rs.p.InitialBackoff
	for attempt := 1; ; attempt++ {
		if attempt >= rs.p.MaxAttempts {
			rs.log.Warn().Err(err).Str("op", op).Str("key", key).Int("attempts", attempt).Msg("objectstore: giving up on a transient failure")
			return err
		}
		if canRetry != nil && !canRetry() {
			return err
		}
		wait := backoff/2 + rand.N(backoff/2+1)
		if rs.p.MaxElapsed > 0 && time.Since(start)+wait > rs.p.MaxElapsed {
			rs.log.Warn().Err(err).Str("op", op).Str("key", key).Int("attempts", attempt).Dur("elapsed", time.Since(start)).Msg("objectstore: giving up on a transient failure: out of time")
			return err
		}
		rs.log.Debug().Err(err).Str("op", op).Str("key", key).Int("attempt", attempt).Dur("backoff", wait).Msg("objectstore: retrying")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("objectstore: %s %q: %w (while retrying: %v)", op, key, ctx.Err(), err)
		case <-t.C:
		}
		backoff = min(time.Duration(float64(backoff)*rs.p.Multiplier), rs.p.MaxBackoff)
		err = fn()
		if err == nil || !IsTransient(err) {
			return err
		}
	}
}

func (rs *retryStore) Put(ctx context.Context, key string, r io.Reader, opts PutOptions) error {
	sk, canSeek := r.(io.Seeker)
	var pos int64
	if canSeek {
		var err error
		if pos, err = sk.Seek(0, io.SeekCurrent); err != nil {
			canSeek = false
		}
	}
	var seekErr error
	var counted *countingReader
	if !canSeek {
		counted = &countingReader{r: r}
		r = counted
	}
	canRetry := func() bool {
		if !canSeek {
			return counted.n == 0
		}
		if _, err := sk.Seek(pos, io.SeekStart); err != nil {
			seekErr = err
			return false
		}
		return true
	}
	err := rs.do(ctx, "put", key, canRetry, func() error { return rs.s.Put(ctx, key, r, opts) })
	if seekErr != nil {
		return fmt.Errorf("%w (not retried: rewinding the reader: %v)", err, seekErr)
	}
	return err
}

func (rs *retryStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return rs.get(ctx, key, 0, -1, func() (io.ReadCloser, error) { return rs.s.Get(ctx, key) })
}

func (rs *retryStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	return rs.get(ctx, key, off, length, func() (io.ReadCloser, error) { return rs.s.GetRange(ctx, key, off, length) })
}

func (rs *retryStore) get(ctx context.Context, key string, off, length int64, open func() (io.ReadCloser, error)) (io.ReadCloser, error) {
	var rc io.ReadCloser
	err := rs.do(ctx, "get", key, nil, func() error {
		var err error
		rc, err = open()
		return err
	})
	if err != nil || !rs.p.ResumeReads {
		return rc, err
	}
	return &retryReader{rs: rs, ctx: ctx, key: key, off: off, length: length, rc: rc}, nil
}

// retryReader reopens the object after a transient read failure
// (RetryPolicy.ResumeReads).
type retryReader struct {
	rs          *retryStore
	ctx         context.Context
	key         string
	off, length int64 // of the whole range
	pos         int64 // bytes delivered
	rc          io.ReadCloser
}

func (r *retryReader) Read(p []byte) (int, error) {
	if r.rc == nil {
		return 0, fmt.Errorf("objectstore: read %q: reader closed or failed", r.key)
	}
	n, err := r.rc.Read(p)
	r.pos += int64(n)
	if err == nil || err == io.EOF || !IsTransient(err) {
		return n, err
	}
	// Reopen at the next byte. The failed reader is closed first.
	r.rc.Close()
	r.rc = nil
	rem := int64(-1)
	if r.length >= 0 {
		rem = r.length - r.pos
	}
	err = r.rs.retryAfter(r.ctx, "read", r.key, err, time.Now(), nil, func() error {
		rc, err := r.rs.s.GetRange(r.ctx, r.key, r.off+r.pos, rem)
		if err == nil {
			r.rc = rc
		}
		return err
	})
	if err != nil {
		return n, err
	}
	return n, nil
}

func (r *retryReader) Close() error {
	if r.rc == nil {
		return nil
	}
	err := r.rc.Close()
	r.rc = nil
	return err
}

func (rs *retryStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	var info ObjectInfo
	err := rs.do(ctx, "stat", key, nil, func() error {
		var err error
		info, err = rs.s.Stat(ctx, key)
		return err
	})
	return info, err
}

// errFromCallback marks an error returned by List's callback, which is
// never retried.
type errFromCallback struct{ err error }

func (e *errFromCallback) Error() string { return e.err.Error() }

func (rs *retryStore) List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error {
	var last string
	started := false
	err := rs.do(ctx, "list", prefix, nil, func() error {
		err := rs.s.List(ctx, prefix, func(info ObjectInfo) error {
			if started && info.Key <= last {
				return nil // delivered by an earlier attempt
			}
			if err := fn(info); err != nil {
				return &errFromCallback{err}
			}
			last, started = info.Key, true
			return nil
		})
		var cb *errFromCallback
		if errors.As(err, &cb) {
			// Not transient, whatever fn returned: stop here.
			return cb
		}
		return err
	})
	var cb *errFromCallback
	if errors.As(err, &cb) {
		return cb.err
	}
	return err
}

func (rs *retryStore) Delete(ctx context.Context, key string) error {
	return rs.do(ctx, "delete", key, nil, func() error { return rs.s.Delete(ctx, key) })
}

func (rs *retryStore) Close() error { return rs.s.Close() }
