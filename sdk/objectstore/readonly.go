package objectstore

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// ErrReadOnly is returned by the writes of a store made with ReadOnly.
var ErrReadOnly = errors.New("objectstore: read-only")

// ReadOnly returns a Store that reads s and refuses every write (Put and
// Delete fail with ErrReadOnly and never reach s): for a process that must
// read a store another process owns, such as a restore that opens a
// pageserver on a cluster's store without ever publishing into it.
// Closing the returned store closes s.
func ReadOnly(s Store) Store { return readOnly{s} }

type readOnly struct{ Store }

func (r readOnly) Put(_ context.Context, key string, _ io.Reader, _ PutOptions) error {
	return fmt.Errorf("%w: put %q", ErrReadOnly, key)
}

func (r readOnly) Delete(_ context.Context, key string) error {
	return fmt.Errorf("%w: delete %q", ErrReadOnly, key)
}
