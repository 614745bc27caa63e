// Package cache is the contract between the compute agent and the page cache
// tiers that sit on its data path (the local file cache, LFC, in RAM or on
// local disk). A Cache maps a pg.PageKey to one 8 KiB page image.
//
// The cache is a pure performance device: it never holds the only copy of a
// page (the pageserver can always rebuild it), so a miss is always correct and
// an implementation may drop any page at any time. It must never return a page
// other than the last one Put for that key (unless that Put was stale, see
// Put), and never bytes of another key.
//
// This package also holds the in-memory reference implementation (NewMemory),
// the wait accounting every tier records into (Waits), PageLSN, the Advisor
// contract for batched sizing decisions (which may run out of process,
// through the gRPC shim in grpc_advisor.go) and, in cachetest, the acceptance
// suite every implementation runs.
//
// It is not the shared_buffers sizing logic (plugins/cache/sharedbuffers).
// A Cache is called once per page and must live in the agent's process; only
// an Advisor may cross a process boundary.
package cache

import (
	"errors"

	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors. Implementations wrap them so that callers test with
// errors.Is.
var (
	// ErrClosed: the cache was closed.
	ErrClosed = errors.New("cache: closed")
	// ErrPageSize: Put was given a page that is not exactly pg.BlockSize bytes.
	ErrPageSize = errors.New("cache: page is not pg.BlockSize bytes")
	// ErrShortBuffer: Get was given a destination shorter than pg.BlockSize.
	ErrShortBuffer = errors.New("cache: destination shorter than pg.BlockSize")
	// ErrBadSize: Resize was given a negative size.
	ErrBadSize = errors.New("cache: invalid size")
)

// Cache is a bounded map from page keys to page images.
//
// Concurrency: every method may be called from many goroutines at once,
// including Resize while Gets and Puts run.
//
// Ownership: the cache never retains a slice passed to it. Get copies the
// page into dst; Put copies page before it returns, so the caller may reuse
// both buffers at once.
//
// Errors: ErrClosed after Close; ErrPageSize, ErrShortBuffer and ErrBadSize
// for bad arguments; any other error is an I/O failure of the tier (a disk
// tier's pread or pwrite), after which the affected page is no longer cached.
type Cache interface {
	// Get copies the page of key into dst[:pg.BlockSize] and reports true,
	// or reports false on a miss (leaving dst unspecified). Bytes of dst past
	// pg.BlockSize are never touched.
	Get(key pg.PageKey, dst []byte) (hit bool, err error)

	// Put stores a copy of page (exactly pg.BlockSize bytes) under key,
	// evicting other pages if the cache is full. lsn is the LSN the page
	// image is valid at: if the cache already holds the key at a higher LSN,
	// the Put is stale (a late fill racing a newer write) and is ignored.
	// pg.InvalidLSN means "unknown" and always overwrites. The guard holds
	// only while the key stays cached: after an eviction or invalidation a
	// late Put at an older LSN is stored, so a caller that may fill a page
	// concurrently with a newer write of it must order the two itself
	// (Postgres does: one block is read and written through one buffer,
	// under its I/O lock). A cache of capacity zero accepts and drops every
	// Put.
	Put(key pg.PageKey, page []byte, lsn pg.LSN) error

	// Invalidate drops key if it is cached. It is not an error if it is not.
	Invalidate(key pg.PageKey) error

	// InvalidateRel drops every cached page of relation fork tag whose block
	// number is >= from: from 0 drops the whole fork (DROP, a new
	// relfilenode), from n is a truncation to n blocks.
	InvalidateRel(tag pg.RelTag, from uint32) error

	// Resize changes the capacity to bytes (rounded down to the
	// implementation's allocation unit, see Stats.CapacityBytes). When it
	// returns, Stats.UsedBytes <= the new capacity. Shrinking evicts by the
	// eviction policy; growing never drops pages.
	Resize(bytes int64) error

	// Stats returns counters and sizes. It is safe after Close.
	Stats() Stats

	// Close releases the cache's memory and files. Calls after Close fail
	// with ErrClosed; Close is idempotent.
	Close() error
}

// Stats describes a cache at one moment. Counters only grow.
type Stats struct {
	Hits, Misses  uint64 // Gets that found / did not find the page
	Puts          uint64 // Puts that stored a page (not stale, not dropped)
	StalePuts     uint64 // Puts ignored because a newer LSN was cached
	Evictions     uint64 // allocation units evicted to make room or to shrink
	Invalidations uint64 // pages dropped by Invalidate or InvalidateRel

	Pages         int64 // pages held now
	UsedBytes     int64 // capacity in use now (whole allocation units)
	CapacityBytes int64 // current capacity after rounding
}
