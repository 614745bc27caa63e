package timeline

// ImagePolicy decides when the timeline materializes full values (images).
// It is called on hot paths and must be cheap and safe for concurrent use.
type ImagePolicy interface {
	// Name identifies the policy in logs and metrics.
	Name() string
	// MaterializeAfter returns the number of consecutive deltas of a key
	// after which Ingest materializes an image of it (with the redo
	// engine) at the same LSN; 0 never does.
	MaterializeAfter() int
	// WantImageLayer reports whether to write an image layer for the whole
	// key space now, given the delta layers written since the last image
	// layer (count and bytes). Image layers bound reads and let GC drop
	// the deltas below them.
	WantImageLayer(deltaLayers int, deltaBytes int64) bool
}

// WritebackPolicy: images come from the compute's page writes; every version
// is already an image, so no materialization is needed. Image layers are
// written once enough delta bytes piled up (so GC can drop old layers).
type WritebackPolicy struct {
	// ImageLayerBytes: write an image layer after this many delta bytes
	// (0: 256 MiB).
	ImageLayerBytes int64
}

// Name implements ImagePolicy.
func (WritebackPolicy) Name() string { return "writeback" }

// MaterializeAfter implements ImagePolicy.
func (WritebackPolicy) MaterializeAfter() int { return 0 }

// WantImageLayer implements ImagePolicy.
func (p WritebackPolicy) WantImageLayer(n int, b int64) bool {
	lim := p.ImageLayerBytes
	if lim == 0 {
		lim = 256 << 20
	}
	return b >= lim
}

// FPIPolicy: images come from full page images in the WAL (Postgres with
// full_page_writes=on); like WritebackPolicy otherwise.
type FPIPolicy struct{ WritebackPolicy }

// Name implements ImagePolicy.
func (FPIPolicy) Name() string { return "fpi" }

// PushdownPolicy materializes a key after N deltas ("image generation
// pushdown"), which needs the redo engine.
type PushdownPolicy struct {
	N int
	WritebackPolicy
}

// Name implements ImagePolicy.
func (PushdownPolicy) Name() string { return "pushdown" }

// MaterializeAfter implements ImagePolicy.
func (p PushdownPolicy) MaterializeAfter() int { return p.N }
