// Package replication is the contract between strata's WAL replication
// plugins (pg-stream: the safekeeper quorum fed by Postgres streaming
// replication) and the WAL's consumers: the pageserver, which follows
// committed WAL and reports its progress back, and tools that read WAL.
//
// A WAL source only ever hands out committed WAL: bytes that a quorum holds
// durably (DESIGN.md invariants 1 and 2), so a consumer may make anything
// it derives from them durable.
//
// It is not the Postgres side of replication (that is Postgres' own
// protocol) and not the election API (core/safekeeper).
package replication

import (
	"context"
	"errors"

	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors; implementations wrap them so that errors.Is works on both
// sides of a plugin boundary.
var (
	// ErrNotHeld: the WAL asked for is not available (removed after
	// archiving, or not yet written).
	ErrNotHeld = errors.New("replication: WAL not held")
	// ErrCorrupt: the stored WAL failed verification and no good copy was
	// found.
	ErrCorrupt = errors.New("replication: WAL corrupt")
	// ErrClosed: the source or stream was closed.
	ErrClosed = errors.New("replication: closed")
)

// Positions describe a WAL source.
type Positions struct {
	// SystemID is the Postgres system identifier of the WAL.
	SystemID uint64
	// Start is the first LSN the source can stream from.
	Start pg.LSN
	// Commit is the end of the committed (quorum-durable) WAL.
	Commit pg.LSN
}

// Chunk is a piece of committed WAL.
type Chunk struct {
	// Start is the LSN of Data[0].
	Start pg.LSN
	// Data are WAL bytes, exactly as in Postgres' pg_wal. The receiver owns
	// the slice.
	Data []byte
	// Commit is the source's commit LSN when the chunk was sent.
	Commit pg.LSN
}

// Progress is what a consumer reports back.
type Progress struct {
	// Received: all WAL below it has been received.
	Received pg.LSN
	// Durable: everything derived from WAL below it is durable at the
	// consumer (the source may then drop WAL below min(Durable, archived)).
	Durable pg.LSN
	// Uploaded: the consumer's derived state up to it is in the object store.
	Uploaded pg.LSN
}

// Source is a WAL replication plugin as its consumers see it.
//
// Concurrency: all methods may be called from many goroutines; each Stream
// is used by one goroutine at a time (Recv and Feedback may be called
// concurrently with each other).
type Source interface {
	// Positions returns the source's current positions.
	Positions(ctx context.Context) (Positions, error)
	// Stream opens a stream of committed WAL from start for the named
	// consumer. It fails with ErrNotHeld when start is below Positions.Start.
	Stream(ctx context.Context, consumer string, start pg.LSN) (Stream, error)
	// Close releases the source.
	Close() error
}

// Stream is an open WAL stream.
type Stream interface {
	// Recv blocks until the next chunk (contiguous with the previous one)
	// is available and returns it. Chunks never pass the commit LSN.
	Recv() (Chunk, error)
	// Feedback reports the consumer's progress.
	Feedback(p Progress) error
	// Close ends the stream; a blocked Recv returns.
	Close() error
}
