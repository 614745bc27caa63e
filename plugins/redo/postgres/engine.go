package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

// Engine is the in-process Go redo engine behind the sdk/redo contract.
// It holds no state between calls and is safe for concurrent use.
type Engine struct {
	opts Options
}

var _ redo.Redoer = (*Engine)(nil)

// NewEngine returns an engine.
func NewEngine(opts Options) *Engine { return &Engine{opts: opts} }

// Redo implements redo.Redoer.
func (e *Engine) Redo(ctx context.Context, reqs []redo.Request) ([]redo.Result, error) {
	out := make([]redo.Result, len(reqs))
	for i := range reqs {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		out[i].Page, out[i].Err = e.redoOne(&reqs[i])
	}
	return out, nil
}

func (e *Engine) redoOne(req *redo.Request) ([]byte, error) {
	p := make([]byte, pg.BlockSize)
	have := false
	if req.Base != nil {
		if len(req.Base) != pg.BlockSize {
			return nil, fmt.Errorf("%w: base image of %d bytes", redo.ErrCorrupt, len(req.Base))
		}
		copy(p, req.Base)
		have = true
	}
	for _, rr := range req.Records {
		r, err := wal.Decode(rr.LSN, rr.EndLSN, rr.Data)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", redo.ErrCorrupt, err)
		}
		blk := findBlock(r, req.Key)
		if blk == nil {
			applied := false
			for _, c := range VMClears(r) {
				if c.Page == req.Key {
					if !have {
						return nil, fmt.Errorf("%w: %s: first record at %s only clears bits", redo.ErrNoBase, req.Key, rr.LSN)
					}
					ApplyVMClear(c, p)
					applied = true
				}
			}
			if !applied {
				return nil, fmt.Errorf("%w: record at %s does not touch %s", redo.ErrCorrupt, rr.LSN, req.Key)
			}
			continue
		}
		if !have && !blk.ApplyImage && !blk.WillInit() {
			return nil, fmt.Errorf("%w: %s: first record at %s does not initialize the page", redo.ErrNoBase, req.Key, rr.LSN)
		}
		if err := RedoBlock(r, blk, p, e.opts); err != nil {
			if errors.Is(err, redo.ErrUnsupported) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", redo.ErrCorrupt, err)
		}
		have = true
	}
	if !have {
		return nil, fmt.Errorf("%w: %s", redo.ErrNoBase, req.Key)
	}
	return p, nil
}

func findBlock(r *wal.Record, key pg.PageKey) *wal.BlockRef {
	for i := range r.Blocks {
		if r.Blocks[i].Page == key {
			return &r.Blocks[i]
		}
	}
	return nil
}

// Close implements redo.Redoer.
func (e *Engine) Close() error { return nil }
