// Package objectstore is the contract between strata and the object stores it
// keeps its immutable files in (layer files, manifests, archived WAL).
//
// A Store is a flat namespace of keys to immutable byte strings. Strata never
// modifies an object in place: it writes a new key, and it deletes an old key
// only once a durable newer manifest no longer refers to it (invariant 5 in
// DESIGN.md). Implementations live in plugins/objectstore/<name>; this package
// also holds the in-memory reference store, the wrappers every implementation
// can be combined with, and (in storetest) the acceptance suite that every
// implementation, builtin or external, must pass.
//
// It is not a filesystem: there are no directories, renames or appends.
package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// Sentinel errors. Implementations wrap them (fmt.Errorf("...: %w", ErrNotFound))
// so that callers test with errors.Is, on both sides of a plugin boundary.
var (
	// ErrNotFound: the key does not exist.
	ErrNotFound = errors.New("objectstore: object not found")
	// ErrExists: a Put with IfNotExists lost to an existing object.
	ErrExists = errors.New("objectstore: object already exists")
	// ErrInvalidKey: the key breaks the rules of ValidateKey.
	ErrInvalidKey = errors.New("objectstore: invalid key")
	// ErrInvalidRange: a ranged read starts beyond the end of the object.
	ErrInvalidRange = errors.New("objectstore: invalid range")
	// ErrTransient marks a failure that may succeed when the call is repeated
	// (a timeout, a throttled request, a dropped connection). The retry wrapper
	// retries exactly the errors that match it.
	ErrTransient = errors.New("objectstore: transient failure")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("objectstore: store closed")
)

// Transient wraps err so that errors.Is(err, ErrTransient) holds, keeping err
// in the chain. It returns nil for nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &transientError{err}
}

type transientError struct{ err error }

func (e *transientError) Error() string { return e.err.Error() }
func (e *transientError) Unwrap() []error {
	return []error{e.err, ErrTransient}
}

// IsTransient reports whether err is marked as transient.
func IsTransient(err error) bool { return errors.Is(err, ErrTransient) }

// MaxKeyLen is the longest key a Store must accept, in bytes.
const MaxKeyLen = 1024

// ValidateKey checks the key rules that every Store enforces, so that a key
// that works on one backend works on all of them: non-empty, at most MaxKeyLen
// bytes of valid UTF-8, no NUL or control characters, no leading or trailing
// "/", no empty, "." or ".." path segment.
func ValidateKey(key string) error {
	bad := func(why string) error { return fmt.Errorf("%w %q: %s", ErrInvalidKey, key, why) }
	switch {
	case key == "":
		return bad("empty")
	case len(key) > MaxKeyLen:
		return bad("longer than 1024 bytes")
	case !utf8.ValidString(key):
		return bad("not valid UTF-8")
	case strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/"):
		return bad("leading or trailing slash")
	}
	for _, r := range key {
		if r < 0x20 || r == 0x7f {
			return bad("control character")
		}
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return bad("empty, '.' or '..' segment")
		}
	}
	return nil
}

// ObjectInfo describes a stored object.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time // as the backend reports it; may be zero
}

// PutOptions modify a Put.
type PutOptions struct {
	// IfNotExists makes the Put a conditional create: when an object with the
	// key already exists (or another Put with IfNotExists wins a race for it),
	// the Put fails with ErrExists and the existing object is left unchanged.
	// Exactly one of several racing conditional creates succeeds.
	IfNotExists bool
	// Size is the number of bytes r will yield, or -1 when unknown. A correct
	// Size lets a backend pick single-part versus multipart upload; a Store
	// must still work when it is -1.
	Size int64
}

// Store is the object store contract.
//
// Concurrency: every method may be called from many goroutines at once.
//
// Atomicity: a Put is all-or-nothing. Until Put returns nil, readers see the
// previous state of the key (ErrNotFound for a new key), never a prefix of the
// new bytes; if Put fails or its context is cancelled, nothing of it is
// visible. Objects are immutable by convention: strata writes each key once.
// A Put without IfNotExists on an existing key replaces it atomically.
//
// Streaming: Put reads r to EOF without holding the whole object in memory,
// and Get/GetRange return readers that stream; objects may be many hundreds
// of MiB.
//
// Errors: a missing key is ErrNotFound; a malformed key is ErrInvalidKey; a
// conditional create that loses is ErrExists; retryable failures match
// ErrTransient. Context cancellation returns an error matching ctx.Err().
type Store interface {
	// Put stores the bytes of r under key. Put does not close r.
	Put(ctx context.Context, key string, r io.Reader, opts PutOptions) error

	// Get returns a reader of the whole object. The caller owns the reader
	// and must Close it. A missing key fails at Get, not at the first Read.
	Get(ctx context.Context, key string) (io.ReadCloser, error)

	// GetRange returns a reader of length bytes starting at offset off.
	// length < 0 reads to the end. A range that runs past the end of the
	// object is cut short at the end; off greater than the object's size is
	// ErrInvalidRange (off equal to the size yields an empty reader).
	GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error)

	// Stat returns the object's metadata.
	Stat(ctx context.Context, key string) (ObjectInfo, error)

	// List calls fn for every object whose key starts with prefix, in
	// ascending byte order of key, paginating through the backend as needed.
	// An empty prefix lists everything. If fn returns an error, List stops
	// and returns that error. Objects put or deleted while List runs may or
	// may not be seen.
	List(ctx context.Context, prefix string, fn func(ObjectInfo) error) error

	// Delete removes the object. Deleting a missing key is not an error.
	Delete(ctx context.Context, key string) error

	// Close releases the store's resources. Calls after Close fail with
	// ErrClosed, or with the backend's own error.
	Close() error
}
