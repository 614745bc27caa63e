// Package redotest is the acceptance suite every redo.Redoer runs: batch
// shape, per-page errors that do not fail a batch, cancellation, and
// exactness on cases taken from real WAL.
package redotest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

// Case is one page to rebuild and what it must look like.
type Case struct {
	Name string
	Req  redo.Request
	// Want is the expected page; nil when WantErr is set.
	Want []byte
	// WantErr is the sentinel the result must wrap, or nil.
	WantErr error
	// Mask, when set, blanks the fields Postgres ignores in consistency
	// checks; it is applied to copies of both pages before comparing.
	Mask func(page []byte)
}

// Run runs the suite against the engine open returns. Cases should come
// from real WAL and include at least one page that redoes correctly.
func Run(t *testing.T, open func(t *testing.T) redo.Redoer, cases []Case) {
	t.Helper()
	if len(cases) == 0 {
		t.Fatal("redotest: no cases")
	}
	t.Run("Batch", func(t *testing.T) {
		r := open(t)
		defer r.Close()
		reqs := make([]redo.Request, len(cases))
		for i := range cases {
			reqs[i] = cases[i].Req
		}
		res, err := r.Redo(context.Background(), reqs)
		if err != nil {
			t.Fatalf("Redo: %v", err)
		}
		if len(res) != len(reqs) {
			t.Fatalf("Redo returned %d results for %d requests", len(res), len(reqs))
		}
		for i, c := range cases {
			check(t, c, res[i])
		}
	})
	t.Run("OneByOne", func(t *testing.T) {
		r := open(t)
		defer r.Close()
		for _, c := range cases {
			res, err := r.Redo(context.Background(), []redo.Request{c.Req})
			if err != nil || len(res) != 1 {
				t.Fatalf("%s: Redo: %v (%d results)", c.Name, err, len(res))
			}
			check(t, c, res[0])
		}
	})
	t.Run("NoBase", func(t *testing.T) {
		r := open(t)
		defer r.Close()
		res, err := r.Redo(context.Background(), []redo.Request{{Key: pg.PageKey{Rel: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(res[0].Err, redo.ErrNoBase) {
			t.Fatalf("empty request: %v, want ErrNoBase", res[0].Err)
		}
	})
	t.Run("BaseUntouched", func(t *testing.T) {
		r := open(t)
		defer r.Close()
		for _, c := range cases {
			if c.Req.Base == nil {
				continue
			}
			before := append([]byte(nil), c.Req.Base...)
			if _, err := r.Redo(context.Background(), []redo.Request{c.Req}); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(before, c.Req.Base) {
				t.Fatalf("%s: Redo modified the request's base image", c.Name)
			}
		}
	})
	t.Run("Cancelled", func(t *testing.T) {
		r := open(t)
		defer r.Close()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := r.Redo(ctx, []redo.Request{cases[0].Req}); !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled context: %v", err)
		}
	})
}

func check(t *testing.T, c Case, res redo.Result) {
	t.Helper()
	if c.WantErr != nil {
		if !errors.Is(res.Err, c.WantErr) {
			t.Errorf("%s: error %v, want %v", c.Name, res.Err, c.WantErr)
		}
		return
	}
	if res.Err != nil {
		t.Errorf("%s: %v", c.Name, res.Err)
		return
	}
	if len(res.Page) != pg.BlockSize {
		t.Errorf("%s: page of %d bytes", c.Name, len(res.Page))
		return
	}
	got, want := append([]byte(nil), res.Page...), append([]byte(nil), c.Want...)
	if c.Mask != nil {
		c.Mask(got)
		c.Mask(want)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: page differs from Postgres'", c.Name)
	}
}
