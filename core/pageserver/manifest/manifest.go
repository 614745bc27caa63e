// Package manifest keeps a timeline's manifest, the list of layer files
// that make up the timeline at a disk-consistent LSN, locally and in the
// object store, and moves layer files to and from the object store.
//
// Object store layout, per timeline:
//
//	timelines/<id>/layers/<layer name>         immutable layer files
//	timelines/<id>/manifest-<generation>       JSON Manifest, generation as 20 digits
//
// The protocol: a pageserver uploads the new layer files first (in
// parallel), then creates manifest-<g+1> with a conditional create
// (PutOptions.IfNotExists), where g is the generation it last read or
// wrote. The manifest is the barrier: a layer is part of the timeline only
// once a manifest names it. If the conditional create loses, another
// pageserver has published generation g+1: this one is fenced
// (ErrFenced) and must stop publishing. Layer files that no durable newest
// manifest names are deleted only after that manifest is published
// (invariant 5).
package manifest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/internal/pacedwrite"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrFenced: another pageserver published the generation this one
	// wanted; this pageserver no longer owns the timeline.
	ErrFenced = errors.New("manifest: fenced by a newer generation")
	// ErrNoManifest: the object store holds no manifest for the timeline.
	ErrNoManifest = errors.New("manifest: no manifest")
	// ErrCorrupt: a manifest does not decode.
	ErrCorrupt = errors.New("manifest: corrupt")
)

// Manifest describes a timeline at DiskConsistentLSN: every version at or
// below it is in the listed layers (or in the ancestor at or below
// AncestorLSN).
type Manifest struct {
	Version           int          `json:"version"`
	Timeline          string       `json:"timeline"`
	Ancestor          string       `json:"ancestor,omitempty"`
	AncestorLSN       pg.LSN       `json:"ancestor_lsn,omitempty"`
	Generation        uint64       `json:"generation"`
	DiskConsistentLSN pg.LSN       `json:"disk_consistent_lsn"`
	GCCutoff          pg.LSN       `json:"gc_cutoff,omitempty"`
	MaxSeq            uint64       `json:"max_seq"`
	Layers            []layer.Desc `json:"layers"`
	WrittenAt         time.Time    `json:"written_at"`
}

// SameContent reports whether m and o describe the same state: every field
// but WrittenAt is equal. A save of a manifest with the same content as the
// last one can be skipped.
func (m *Manifest) SameContent(o *Manifest) bool {
	if m == nil || o == nil {
		return m == o
	}
	return m.Version == o.Version && m.Timeline == o.Timeline && m.Ancestor == o.Ancestor &&
		m.AncestorLSN == o.AncestorLSN && m.Generation == o.Generation &&
		m.DiskConsistentLSN == o.DiskConsistentLSN && m.GCCutoff == o.GCCutoff &&
		m.MaxSeq == o.MaxSeq && slices.Equal(m.Layers, o.Layers)
}

// Encode returns the JSON form.
func (m *Manifest) Encode() ([]byte, error) { return json.MarshalIndent(m, "", " ") }

// Decode parses a manifest and fills the layers' key ranges.
func Decode(b []byte) (*Manifest, error) {
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	for i := range m.Layers {
		if err := m.Layers[i].Fill(); err != nil {
			return nil, fmt.Errorf("%w: layer %s: %v", ErrCorrupt, m.Layers[i].Name, err)
		}
		if !layer.ValidName(m.Layers[i].Name) {
			return nil, fmt.Errorf("%w: bad layer name %q", ErrCorrupt, m.Layers[i].Name)
		}
	}
	return &m, nil
}

// SaveLocal writes m to path atomically (temp file, fsync, rename, fsync dir).
func SaveLocal(path string, m *Manifest) error {
	b, err := m.Encode()
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// LoadLocal reads a manifest written by SaveLocal; os.ErrNotExist if none.
func LoadLocal(path string) (*Manifest, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Decode(b)
}

// Remote is a timeline-agnostic view of the object store. Safe for
// concurrent use.
type Remote struct {
	Store objectstore.Store
	// Parallel bounds concurrent layer uploads (default 8).
	Parallel int
}

// TimelinePrefix returns "timelines/<id>/".
func TimelinePrefix(tl pg.TimelineID) string { return "timelines/" + tl.String() + "/" }

// LayerKey returns the object key of a layer file.
func LayerKey(tl pg.TimelineID, name string) string { return TimelinePrefix(tl) + "layers/" + name }

// ManifestKey returns the object key of a manifest generation.
func ManifestKey(tl pg.TimelineID, gen uint64) string {
	return fmt.Sprintf("%smanifest-%020d", TimelinePrefix(tl), gen)
}

// Latest returns the newest manifest of the timeline, or ErrNoManifest.
func (r *Remote) Latest(ctx context.Context, tl pg.TimelineID) (*Manifest, error) {
	var last string
	err := r.Store.List(ctx, TimelinePrefix(tl)+"manifest-", func(o objectstore.ObjectInfo) error {
		last = o.Key
		return nil
	})
	if err != nil {
		return nil, err
	}
	if last == "" {
		return nil, fmt.Errorf("%w for timeline %s", ErrNoManifest, tl)
	}
	rc, err := r.Store.Get(ctx, last)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, err
	}
	m, err := Decode(b)
	if err != nil {
		return nil, err
	}
	if gen, _ := strconv.ParseUint(strings.TrimPrefix(last, TimelinePrefix(tl)+"manifest-"), 10, 64); gen != m.Generation {
		return nil, fmt.Errorf("%w: %s holds generation %d", ErrCorrupt, last, m.Generation)
	}
	return m, nil
}

// Unanswered says whether err, from a call to the store under a deadline
// of the caller's, means that the store did not answer: a failure it
// marks as passing (objectstore.ErrTransient: throttling, 5xx, a cut or
// stalled connection) or no answer before the deadline. A restart uses
// the local disk then instead of failing; any other error (a bucket that
// does not exist, refused credentials) is the configuration's.
func Unanswered(err error) bool {
	return objectstore.IsTransient(err) || errors.Is(err, context.DeadlineExceeded)
}

// Timelines lists the timelines that have at least one manifest.
func (r *Remote) Timelines(ctx context.Context) ([]pg.TimelineID, error) {
	seen := map[pg.TimelineID]bool{}
	var out []pg.TimelineID
	err := r.Store.List(ctx, "timelines/", func(o objectstore.ObjectInfo) error {
		rest := strings.TrimPrefix(o.Key, "timelines/")
		id, name, ok := strings.Cut(rest, "/")
		if !ok || !strings.HasPrefix(name, "manifest-") {
			return nil
		}
		tl, err := pg.ParseTimelineID(id)
		if err == nil && !seen[tl] {
			seen[tl] = true
			out = append(out, tl)
		}
		return nil
	})
	return out, err
}

// LayerSizes returns the layer objects of the timeline in the store, by
// layer name, with their sizes.
func (r *Remote) LayerSizes(ctx context.Context, tl pg.TimelineID) (map[string]int64, error) {
	prefix := LayerKey(tl, "")
	out := map[string]int64{}
	err := r.Store.List(ctx, prefix, func(o objectstore.ObjectInfo) error {
		out[strings.TrimPrefix(o.Key, prefix)] = o.Size
		return nil
	})
	return out, err
}

// UploadLayers uploads the local files dir/<name> of the given layers in
// parallel, calling done (if not nil; from any goroutine) after each
// success. It returns the first error after all uploads ended.
func (r *Remote) UploadLayers(ctx context.Context, tl pg.TimelineID, dir string, layers []layer.Desc, done func(name string)) error {
	par := r.Parallel
	if par <= 0 {
		par = 8
	}
	sem := make(chan struct{}, par)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for _, d := range layers {
		wg.Add(1)
		sem <- struct{}{}
		go func(d layer.Desc) {
			defer wg.Done()
			defer func() { <-sem }()
			if err := r.uploadFile(ctx, LayerKey(tl, d.Name), filepath.Join(dir, d.Name), d.Size); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("manifest: upload %s: %w", d.Name, err)
				}
				mu.Unlock()
			} else if done != nil {
				done(d.Name)
			}
		}(d)
	}
	wg.Wait()
	return first
}

func (r *Remote) uploadFile(ctx context.Context, key, path string, size int64) error {
	// Layer files are immutable: a store that can take the file without
	// copying it (the fs store's hard link) may.
	return objectstore.PutFile(ctx, r.Store, key, path, objectstore.PutOptions{Size: size})
}

// Publish creates manifest-<m.Generation> with a conditional create. It
// returns ErrFenced if that generation already exists.
func (r *Remote) Publish(ctx context.Context, tl pg.TimelineID, m *Manifest) error {
	b, err := m.Encode()
	if err != nil {
		return err
	}
	err = r.Store.Put(ctx, ManifestKey(tl, m.Generation), bytes.NewReader(b), objectstore.PutOptions{IfNotExists: true, Size: int64(len(b))})
	if errors.Is(err, objectstore.ErrExists) {
		// A retried create whose first attempt reached the store before it
		// failed (objectstore.WithRetry reports that as ErrExists) finds
		// this very manifest there: published, not fenced.
		if own, rerr := r.holds(ctx, tl, m); rerr == nil && own {
			return nil
		}
		return fmt.Errorf("%w: generation %d of %s exists", ErrFenced, m.Generation, tl)
	}
	return err
}

// holds reports whether the store's manifest of m's generation has m's
// content.
func (r *Remote) holds(ctx context.Context, tl pg.TimelineID, m *Manifest) (bool, error) {
	rc, err := r.Store.Get(ctx, ManifestKey(tl, m.Generation))
	if err != nil {
		return false, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 64<<20))
	if err != nil {
		return false, err
	}
	there, err := Decode(b)
	if err != nil {
		return false, err
	}
	return there.SameContent(m), nil
}

// Download copies a layer file to dst atomically (temp file written
// through pacedwrite, fsync, rename) and checks its size.
func (r *Remote) Download(ctx context.Context, tl pg.TimelineID, d layer.Desc, dst string) error {
	rc, err := r.Store.Get(ctx, LayerKey(tl, d.Name))
	if errors.Is(err, objectstore.ErrNotFound) {
		return fmt.Errorf("manifest: layer %s of timeline %s is gone from the object store, though the manifest read names it (replaced since by a pageserver writing to the store, or lost): %w", d.Name, tl, err)
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp := dst + ".download"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	n, err := io.Copy(pacedwrite.New(f), rc)
	if err == nil && n != d.Size {
		err = fmt.Errorf("manifest: layer %s: downloaded %d bytes, want %d", d.Name, n, d.Size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, dst)
}

// DeleteLayers deletes layer objects. REQUIRES: a published manifest newer
// than every manifest that names them no longer names them.
func (r *Remote) DeleteLayers(ctx context.Context, tl pg.TimelineID, names []string) error {
	var errs []error
	for _, n := range names {
		if err := r.Store.Delete(ctx, LayerKey(tl, n)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PruneManifests deletes manifests of the timeline older than generation
// keepFrom.
func (r *Remote) PruneManifests(ctx context.Context, tl pg.TimelineID, keepFrom uint64) error {
	var old []string
	err := r.Store.List(ctx, TimelinePrefix(tl)+"manifest-", func(o objectstore.ObjectInfo) error {
		g, err := strconv.ParseUint(strings.TrimPrefix(o.Key, TimelinePrefix(tl)+"manifest-"), 10, 64)
		if err == nil && g < keepFrom {
			old = append(old, o.Key)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, k := range old {
		if err := r.Store.Delete(ctx, k); err != nil {
			return err
		}
	}
	return nil
}
