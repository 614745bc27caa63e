// Package redo is the contract between strata's pageserver and a WAL redo
// engine: given a page's base image (or none) and the WAL records that
// touch it, in LSN order, produce the page as Postgres would have it. It
// also holds ImagePolicy, which decides when the pageserver materializes a
// full page image instead of keeping deltas.
//
// It is not a WAL decoder and knows no record formats; the Go-native
// engine lives in plugins/redo/postgres.
package redo

import (
	"context"
	"errors"

	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrUnsupported means a record touches a page but the engine cannot
	// redo it. The error text names the record type (for example
	// "Btree/DEDUP"); the engine never skips such a record silently.
	ErrUnsupported = errors.New("redo: unsupported record")
	// ErrNoBase means a page has neither a base image nor a first record
	// that initializes it.
	ErrNoBase = errors.New("redo: no base image")
	// ErrCorrupt means a record's data does not fit the page it is applied to.
	ErrCorrupt = errors.New("redo: record does not apply")
)

// Record is one WAL record as the pageserver stores it: its start LSN, its
// end LSN (Postgres' EndRecPtr, which redo writes into page LSNs) and its
// raw bytes, header included.
type Record struct {
	LSN    pg.LSN
	EndLSN pg.LSN
	Data   []byte
}

// Request asks for one page at one LSN.
type Request struct {
	Key pg.PageKey
	// Base is the page image to start from (pg.BlockSize bytes), or nil when
	// the page starts empty (the first record must initialize it).
	Base []byte
	// Records touch Key, in LSN order, all after Base's LSN.
	Records []Record
}

// Result is the page produced for one Request, or the error for it.
type Result struct {
	Page []byte // pg.BlockSize bytes, owned by the caller
	Err  error
}

// Redoer applies WAL records to pages.
//
// Redo answers every request of a batch: results[i] belongs to reqs[i].
// A per-page failure (ErrUnsupported, ErrNoBase, ErrCorrupt) is reported in
// its Result and does not fail the batch; the returned error is for the
// batch as a whole (ctx cancelled, engine closed). Redo does not modify
// reqs (Base and Data are read only) and may be called concurrently.
type Redoer interface {
	Redo(ctx context.Context, reqs []Request) ([]Result, error)
	Close() error
}

// PageHistory describes what the pageserver holds for one page since its
// last image, as seen when one more record for it is ingested.
type PageHistory struct {
	Key        pg.PageKey
	Deltas     int // records since the last image, this one included
	DeltaBytes int // their total size
	// FPI reports that the newest record carries a full page image.
	FPI bool
	// Burst is how many records for the page the current ingest batch
	// holds so far (this one included): a measure of how write-hot the
	// page is right now.
	Burst int
}

// ImagePolicy decides when to materialize a full page image. It is called
// on the pageserver's hot path, so implementations must be cheap and safe
// for concurrent use.
type ImagePolicy interface {
	ShouldMaterialize(h PageHistory) bool
}

// DeltaPolicy materializes an image once a page has NDeltas records or
// NBytes bytes of records since its last image (zero disables a limit).
// It is the "image generation pushdown" that makes full_page_writes=off
// cheap.
type DeltaPolicy struct {
	NDeltas int
	NBytes  int
}

// ShouldMaterialize implements ImagePolicy.
func (p DeltaPolicy) ShouldMaterialize(h PageHistory) bool {
	return (p.NDeltas > 0 && h.Deltas >= p.NDeltas) || (p.NBytes > 0 && h.DeltaBytes >= p.NBytes)
}

// FPIPolicy stores an image only when the WAL itself carries one (a full
// page image), as stock Postgres replay would have it. It bounds delta
// chains only when Postgres runs with full_page_writes=on (every page gets
// an image after each checkpoint); with full_page_writes=off chains grow
// without limit.
type FPIPolicy struct{}

// ShouldMaterialize implements ImagePolicy.
func (FPIPolicy) ShouldMaterialize(h PageHistory) bool { return h.FPI }

// HotPolicy is DeltaPolicy plus eager images of write-hot pages: a page
// that receives Burst or more records within one ingest batch gets an
// image at once (at the batch's last record for it), so the pages a
// workload hammers are always one image away, whatever N is.
type HotPolicy struct {
	DeltaPolicy
	Burst int // 0 disables the burst rule
}

// ShouldMaterialize implements ImagePolicy.
func (p HotPolicy) ShouldMaterialize(h PageHistory) bool {
	return p.DeltaPolicy.ShouldMaterialize(h) || (p.Burst > 0 && h.Burst >= p.Burst)
}

var (
	_ ImagePolicy = DeltaPolicy{}
	_ ImagePolicy = FPIPolicy{}
	_ ImagePolicy = HotPolicy{}
)
