package timeline

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/sdk/pg"
	"github.com/stratadb/strata/sdk/redo"
)

// ImagePolicy decides when the timeline materializes full values (images).
// It is called on hot paths and must be cheap and safe for concurrent use.
//
// The policies, by config name (pageserver.image_policy):
//
//   - writeback: the compute's page writes are the images; nothing to redo.
//   - fpi: images only from full page images in the WAL. Needs Postgres
//     with full_page_writes=on, which bounds every delta chain to the
//     changes since the page's first modification after a checkpoint.
//   - pushdown (the usual redo-mode choice; writeback is the default and
//     is refused with page_source redo): an image after N deltas or N
//     bytes of deltas on a key, made by the redo engine at ingest.
//   - hot: pushdown plus an image as soon as a key gets Burst deltas in one
//     ingest batch (write-hot pages are materialized eagerly).
type ImagePolicy interface {
	// Name identifies the policy in logs and metrics.
	Name() string
	// MaterializeAfter returns the number of consecutive deltas of a key
	// after which Ingest materializes an image of it (with the redo
	// engine) at the same LSN; 0 never does. Policies that also implement
	// KeyPolicy are asked per key instead (see DueImages).
	MaterializeAfter() int
	// WantImageLayer reports whether to run an image pass now (over the
	// key ranges that changed since their image, or the whole key space
	// the first time), given the delta layers above the images of the
	// ranges they overlap (count and bytes) and the bytes of the image
	// files the pass would replace (0 when there are none), about what the
	// pass will cost to write. Image layers bound reads and let GC drop
	// the deltas below them.
	WantImageLayer(deltaLayers int, deltaBytes, imageBytes int64) bool
}

// KeyPolicy is an ImagePolicy that decides per key, from the key's history
// since its last image (deltas, their bytes, the burst in the current
// batch), with the sdk/redo contract. Any redo.ImagePolicy plugin can be
// used through SDKPolicy.
type KeyPolicy interface {
	ImagePolicy
	redo.ImagePolicy
}

// WritebackPolicy: images come from the compute's page writes; every version
// is already an image, so no materialization is needed. Image layers are
// written once enough delta bytes piled up (so GC can drop old layers):
// ImageLayerBytes, and at least as many as the images the pass replaces
// hold. A pass rewrites every page of the ranges it covers, so with a
// fixed limit the bytes written for images per byte of page writes grew
// with the database (a 4 GB database rewritten after every 256 MiB of
// writes: 16 bytes per byte); with the images' size as a floor it stays at
// most one.
type WritebackPolicy struct {
	// ImageLayerBytes: run an image pass after this many delta bytes (0:
	// 256 MiB), or after as many as the images it replaces hold, whichever
	// is more.
	ImageLayerBytes int64
}

// Name implements ImagePolicy.
func (WritebackPolicy) Name() string { return "writeback" }

// MaterializeAfter implements ImagePolicy.
func (WritebackPolicy) MaterializeAfter() int { return 0 }

// WantImageLayer implements ImagePolicy.
func (p WritebackPolicy) WantImageLayer(n int, b, image int64) bool {
	lim := p.ImageLayerBytes
	if lim == 0 {
		lim = 256 << 20
	}
	return b >= max(lim, image)
}

// FPIPolicy: images come from full page images in the WAL (Postgres with
// full_page_writes=on); like WritebackPolicy otherwise.
type FPIPolicy struct{ WritebackPolicy }

// Name implements ImagePolicy.
func (FPIPolicy) Name() string { return "fpi" }

// ShouldMaterialize implements redo.ImagePolicy: never (the WAL's own
// images are stored as images by ingest).
func (FPIPolicy) ShouldMaterialize(redo.PageHistory) bool { return false }

// PushdownPolicy materializes a key after N deltas or NBytes bytes of
// deltas since its last base version ("image generation pushdown"), which
// needs the redo engine. Zero disables a limit.
type PushdownPolicy struct {
	N      int
	NBytes int
	WritebackPolicy
}

// Name implements ImagePolicy.
func (PushdownPolicy) Name() string { return "pushdown" }

// MaterializeAfter implements ImagePolicy.
func (p PushdownPolicy) MaterializeAfter() int { return p.N }

// ShouldMaterialize implements redo.ImagePolicy.
func (p PushdownPolicy) ShouldMaterialize(h redo.PageHistory) bool {
	return redo.DeltaPolicy{NDeltas: p.N, NBytes: p.NBytes}.ShouldMaterialize(h)
}

// HotPolicy is PushdownPolicy plus eager images of write-hot keys: a key
// with Burst or more deltas in one ingest batch is materialized at once.
type HotPolicy struct {
	PushdownPolicy
	Burst int
}

// Name implements ImagePolicy.
func (HotPolicy) Name() string { return "hot" }

// ShouldMaterialize implements redo.ImagePolicy.
func (p HotPolicy) ShouldMaterialize(h redo.PageHistory) bool {
	return redo.HotPolicy{DeltaPolicy: redo.DeltaPolicy{NDeltas: p.N, NBytes: p.NBytes}, Burst: p.Burst}.ShouldMaterialize(h)
}

// SDKPolicy runs any sdk/redo image policy (a plugin) as a KeyPolicy, with
// WritebackPolicy's image layer rule.
type SDKPolicy struct {
	PolicyName string
	Policy     redo.ImagePolicy
	WritebackPolicy
}

// Name implements ImagePolicy.
func (p SDKPolicy) Name() string { return p.PolicyName }

// MaterializeAfter implements ImagePolicy (decisions are per key).
func (SDKPolicy) MaterializeAfter() int { return 0 }

// ShouldMaterialize implements redo.ImagePolicy.
func (p SDKPolicy) ShouldMaterialize(h redo.PageHistory) bool { return p.Policy.ShouldMaterialize(h) }

var (
	_ ImagePolicy = WritebackPolicy{}
	_ KeyPolicy   = FPIPolicy{}
	_ KeyPolicy   = PushdownPolicy{}
	_ KeyPolicy   = HotPolicy{}
	_ KeyPolicy   = SDKPolicy{}
)

// chainState packs, into the int that Timeline.chains keeps per key, the
// deltas (low 20 bits, saturating) and their bytes (the rest) since the
// key's last base version.
type chainState int

const chainCountBits = 20

func (s chainState) deltas() int { return int(s) & (1<<chainCountBits - 1) }
func (s chainState) bytes() int  { return int(s) >> chainCountBits }

func (s chainState) add(n int) chainState {
	d := min(s.deltas()+1, 1<<chainCountBits-1)
	return chainState((s.bytes()+n)<<chainCountBits | d)
}

// DueImages returns the images that the policy wants after the versions cs
// were stored: for every delta in cs it updates the key's history and asks
// the policy; a key it accepts is materialized (Get, with the redo engine)
// at that delta's LSN. A base version in cs resets the key's history. With
// a plain ImagePolicy the rule is MaterializeAfter's count. The caller
// stores the returned images (at the same LSNs: images rank above the
// deltas they replace) and must hold t.writeMu: Ingest calls it after
// every batch it stores.
//
// REQUIRES: t.writeMu held; cs already stored.
func (t *Timeline) DueImages(ctx context.Context, cs []Change) ([]Change, error) {
	kp, perKey := t.d.Policy.(KeyPolicy)
	n := t.d.Policy.MaterializeAfter()
	if (!perKey && n <= 0) || t.d.Redo == nil {
		return nil, nil
	}
	burst := map[keyspace.Key]int{}
	due := map[keyspace.Key]int{} // key -> index in cs of the delta to materialize at
	for i, c := range cs {
		if c.Kind.IsBase() {
			delete(t.chains, c.Key)
			delete(due, c.Key)
			continue
		}
		st := chainState(t.chains[c.Key]).add(len(c.Data))
		burst[c.Key]++
		h := redo.PageHistory{Deltas: st.deltas(), DeltaBytes: st.bytes(), Burst: burst[c.Key]}
		if c.Key.IsRelBlock() {
			h.Key = c.Key.PageKey()
		}
		var want bool
		if perKey {
			want = kp.ShouldMaterialize(h)
		} else {
			want = h.Deltas >= n
		}
		if want {
			// The newest due delta of a key in the batch is enough: an
			// image there covers the older ones.
			due[c.Key] = i
			delete(t.chains, c.Key)
			burst[c.Key] = 0
			continue
		}
		t.chains[c.Key] = int(st)
	}
	var imgs []Change
	for i, c := range cs {
		if j, ok := due[c.Key]; !ok || j != i {
			continue
		}
		// Not t.Get: its page cache would take this value, at an LSN below
		// versions of the key that cs already stored, for the newest.
		cands, _, err := t.collect(ctx, c.Key, c.LSN)
		var d []byte
		if err == nil {
			d, _, err = t.materialize(ctx, c.Key, c.LSN, cands)
		}
		if errors.Is(err, redo.ErrUnsupported) {
			// The deltas stay stored (nothing of the WAL is lost) and
			// ingest goes on: one page the engine cannot rebuild must not
			// stop every other page's WAL. Reads of this page fail with
			// the same error until a base version (a full page image)
			// replaces its chain.
			t.d.Metrics.unsupportedImage()
			t.logUnsupported(c.Key, c.LSN, err)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("timeline: %s materialization of %s at %s: %w", t.d.Policy.Name(), c.Key, c.LSN, err)
		}
		imgs = append(imgs, Change{Key: c.Key, LSN: c.LSN, Kind: layer.Image, Data: d})
	}
	return imgs, nil
}

// unsupportedLogEvery bounds the error log of pages whose image the redo
// engine cannot make (the metric counts every one).
const unsupportedLogEvery = time.Minute

// logUnsupported logs a page the image policy wanted an image of but the
// redo engine cannot rebuild: the first one of the timeline and then at
// most one a minute, with how many were skipped in between.
func (t *Timeline) logUnsupported(k keyspace.Key, lsn pg.LSN, err error) {
	now := time.Now()
	t.unsupported.n++
	if !t.unsupported.last.IsZero() && now.Sub(t.unsupported.last) < unsupportedLogEvery {
		return
	}
	t.log.Error().Err(err).Stringer("key", k).Stringer("lsn", lsn).Int("pages_since_last_log", t.unsupported.n).
		Msg("the redo engine cannot rebuild this page (a record of a type it does not replay, such as an extension's resource manager): its WAL is kept and ingest goes on, but reads of the page and image layers fail; drop the index (or table) it belongs to, or use storage.page_source: writeback")
	t.unsupported.last, t.unsupported.n = now, 0
}
