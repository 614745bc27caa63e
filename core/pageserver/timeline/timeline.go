// Package timeline is the pageserver's storage engine for one timeline (a
// branch of history): it takes versions of keys (page writes from the
// compute, decoded WAL), keeps them in an in-memory layer backed by an
// append-only log, flushes them into immutable delta layer files indexed by
// a layer map, compacts and garbage-collects those files, uploads them with
// a manifest to the object store, and answers reads of any key at any LSN
// (GetPage@LSN), falling through to the ancestor timeline below the branch
// point.
//
// # The durability gate (writeback mode)
//
// A version written by the compute (Put) is tagged with W, the compute's WAL
// position when the write was made. It becomes durable (appended to the log,
// then flushed and uploaded) only once the safekeeper quorum's commit LSN,
// read from a CommitLSNSource, has reached W: invariant 2 in DESIGN.md.
// Until then the version is "pending": readers see it (the compute must read
// its own writes back) but a restart forgets it, and the compute agent must
// keep it until LSNs().Durable reaches W. Decoded WAL (Ingest) is already
// quorum-committed and is written through.
//
// # Ingested WAL
//
// Ingest appends decoded WAL and fsyncs before it returns; IngestBuffered
// appends without the fsync (SyncIngested, the background loop and any
// later synced write make it durable) and LSNs().Durable stays at the last
// synced point, which is what the safekeepers may trust. Each call is one
// batch in the log: after a crash a batch is there whole or not at all.
//
// # Reads
//
// A read at the latest LSN is answered by the page cache (sharded, no
// timeline lock) once the key's newest value was materialized; otherwise
// it collects the versions it needs (from the newest base version on) from
// the in-memory layers and the layer files (read through a read-only
// mapping), newest first.
//
// The package does not decode WAL, talk to safekeepers or serve the
// network; see the Ingest API and the server package.
package timeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/layer"
	"github.com/stratadb/strata/core/pageserver/layermap"
	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/internal/trouble"
	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrNotFound: the key has no value at the LSN (never written, dropped
	// or unlinked).
	ErrNotFound = errors.New("timeline: not found")
	// ErrNoRedo: materializing the value needs WAL redo and no Redo engine
	// is configured.
	ErrNoRedo = errors.New("timeline: delta records need a redo engine")
	// ErrMissingBase: a chain of deltas has no image below it.
	ErrMissingBase = errors.New("timeline: delta chain without a base image")
	// ErrWaitLSNTimeout: the timeline did not reach the awaited LSN in time.
	ErrWaitLSNTimeout = errors.New("timeline: timed out waiting for WAL")
	// ErrBelowGCCutoff: the read or branch LSN is older than the GC cutoff.
	ErrBelowGCCutoff = errors.New("timeline: LSN is below the GC cutoff")
	// ErrClosed: the timeline was closed.
	ErrClosed = errors.New("timeline: closed")
)

// LatestLSN as a read LSN means "the newest version".
const LatestLSN = pg.LSN(^uint64(0))

// CommitLSNSource tells the durability gate how far the safekeeper quorum
// holds WAL. CommitLSN never decreases and must be cheap and safe for
// concurrent use; the timeline polls it on every write and on a ticker,
// and can be nudged with Timeline.CommitAdvanced.
type CommitLSNSource interface {
	CommitLSN() pg.LSN
}

// CommitLSN is a settable CommitLSNSource (for tests and for a server that
// receives the commit LSN from outside).
type CommitLSN struct{ v atomic.Uint64 }

// CommitLSN implements CommitLSNSource.
func (c *CommitLSN) CommitLSN() pg.LSN { return pg.LSN(c.v.Load()) }

// Set raises the commit LSN to l (it never goes back).
func (c *CommitLSN) Set(l pg.LSN) {
	for {
		o := c.v.Load()
		if uint64(l) <= o || c.v.CompareAndSwap(o, uint64(l)) {
			return
		}
	}
}

// Redo applies WAL records to a page. base is nil when the first record
// initializes the page (will_init). records are oldest first. The result is
// owned by the caller. Implementations must be safe for concurrent use.
type Redo interface {
	Apply(key keyspace.Key, lsn pg.LSN, base []byte, records [][]byte) ([]byte, error)
}

// Options tune a timeline. Zero values take the defaults of DefaultOptions.
type Options struct {
	// CheckpointDistance: freeze the in-memory layer at this many bytes.
	CheckpointDistance int64
	// CheckpointLSNDistance: ... or when its versions span this many LSN bytes.
	CheckpointLSNDistance uint64
	// CheckpointTimeout: ... or when it is this old.
	CheckpointTimeout time.Duration
	// LayerTargetSize: split flushed and compacted layers at this size.
	LayerTargetSize int64
	// CompactionThreshold: compact L0 delta layers when there are this many.
	CompactionThreshold int
	// GCHorizon: keep history for this many LSN bytes behind the last record.
	GCHorizon uint64
	// PITR: and for this long.
	PITR time.Duration
	// LeaseGrace: after opening a timeline that has history (a restart,
	// or a pageserver taking it over from the store), GC does not raise
	// the cutoff for this long. Leases live in memory, so a restart
	// forgets them; their holders take them again at their next renewal,
	// which comes well within it (a restore renews every 15 s). 0: none.
	LeaseGrace time.Duration
	// WaitLSNTimeout bounds waits for WAL in reads.
	WaitLSNTimeout time.Duration
	// CacheBytes bounds the materialized page cache.
	CacheBytes int64
	// MaxLocalBytes bounds local layer files; cold uploaded layers are evicted
	// above it. 0: unbounded.
	MaxLocalBytes int64
	// BackgroundInterval is the period of the flush/commit/GC/evict loop.
	BackgroundInterval time.Duration
	// NoBackground disables the background loop (tests drive it by hand).
	NoBackground bool
	// DeferOpenCheck leaves the check of the local manifest against the
	// object store to the first upload instead of the open: the
	// pageserver sets it when the store did not answer at its start, so
	// that each timeline's open does not wait for it again.
	DeferOpenCheck bool

	// scanWindow is how many keys of the layer files a scan takes per
	// window (0: scanWindowKeys); tests make it tiny.
	scanWindow int
}

// DefaultOptions returns the defaults.
func DefaultOptions() Options {
	return Options{
		CheckpointDistance:    64 << 20,
		CheckpointLSNDistance: 256 << 20,
		CheckpointTimeout:     10 * time.Minute,
		LayerTargetSize:       64 << 20,
		CompactionThreshold:   8,
		GCHorizon:             64 << 20,
		PITR:                  time.Hour,
		LeaseGrace:            time.Minute,
		WaitLSNTimeout:        30 * time.Second,
		CacheBytes:            64 << 20,
		BackgroundInterval:    time.Second,
	}
}

func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.CheckpointDistance == 0 {
		o.CheckpointDistance = d.CheckpointDistance
	}
	if o.CheckpointLSNDistance == 0 {
		o.CheckpointLSNDistance = d.CheckpointLSNDistance
	}
	if o.CheckpointTimeout == 0 {
		o.CheckpointTimeout = d.CheckpointTimeout
	}
	if o.LayerTargetSize == 0 {
		o.LayerTargetSize = d.LayerTargetSize
	}
	if o.CompactionThreshold == 0 {
		o.CompactionThreshold = d.CompactionThreshold
	}
	if o.WaitLSNTimeout == 0 {
		o.WaitLSNTimeout = d.WaitLSNTimeout
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = d.CacheBytes
	}
	if o.BackgroundInterval == 0 {
		o.BackgroundInterval = d.BackgroundInterval
	}
	return o
}

// Deps are the timeline's collaborators. Only Commit is required.
type Deps struct {
	Log     zerolog.Logger
	Now     func() time.Time
	Commit  CommitLSNSource
	Redo    Redo             // nil: deltas cannot be materialized (ErrNoRedo)
	Policy  ImagePolicy      // nil: WritebackPolicy
	Remote  *manifest.Remote // nil: no object store
	Metrics *Metrics         // nil: no metrics
	// Ancestor and AncestorLSN make the timeline a branch.
	Ancestor    *Timeline
	AncestorLSN pg.LSN
}

// Timeline is one timeline's engine. All methods are safe for concurrent use.
type Timeline struct {
	id   pg.TimelineID
	dir  string
	opts Options
	d    Deps
	log  zerolog.Logger

	writeMu sync.Mutex // serializes writers: Put, Ingest, releasing pending versions

	mu          sync.RWMutex // guards the fields below
	open        *layer.InMem
	logSeq      uint64
	frozen      []*layer.InMem
	memFloor    map[*layer.InMem]pg.LSN // per in-memory layer written to: its floor (noteFloorLocked)
	pending     []layer.Version         // W > commit LSN, in arrival order
	pendingMin  pg.LSN                  // the lowest LSN in pending (0 when it is empty)
	pendingKeys map[keyspace.Key][]layer.Version
	layers      *layermap.Map[*handle]
	gen         uint64
	gcCutoff    pg.LSN
	imageFloor  pg.LSN                 // LSN of the newest image layer, made or being made (putLocked)
	retain      []pg.LSN               // branch points of children
	leases      map[leaseKey]time.Time // when each lease ends (Lease)
	graceEnd    time.Time              // GC keeps the cutoff until then (Options.LeaseGrace)
	removed     []string               // layer names dropped from the map, still in the last published manifest
	lsnTimes    []lsnTime
	fenced      bool
	closed      bool

	// remoteChecked: the layers' "uploaded" marks are known to be about
	// the object store in Deps.Remote (checkRemote); until then no layer is
	// evicted.
	remoteChecked atomic.Bool
	// uploadTrouble: the current run of failed uploads (UploadTrouble).
	uploadMu      sync.Mutex
	uploadTrouble trouble.Run

	seq        atomic.Uint64
	lastRecord atomic.Uint64 // highest LSN ingested or put
	remoteLSN  atomic.Uint64 // disk consistent LSN of the last published manifest
	walWaitMu  sync.Mutex
	walWait    chan struct{} // closed when lastRecord advances
	epoch      atomic.Uint64 // bumped before and after every write (page cache race guard)
	writing    atomic.Int32  // writes in progress (readers do not fill the cache meanwhile)
	gcCut      atomic.Uint64 // gcCutoff, for reads that take no lock
	synced     atomic.Uint64 // every ingested version at or below it is in an fsynced log or a layer file
	dirty      atomic.Bool   // IngestBuffered appended versions that no fsync covers yet
	cache      *pageCache
	chains     map[keyspace.Key]int // chainState per key: deltas and their bytes since its last base (DueImages)
	// unsupported rate-limits logUnsupported (under writeMu, as DueImages).
	unsupported struct {
		last time.Time
		n    int
	}

	// publishMu: one upload, compaction or GC at a time (compaction and
	// GC replace the layers an upload publishes); taken before flushMu.
	// flushMu: one flush, compaction, GC or image pass at a time. An
	// upload, which may wait minutes for a slow store, holds publishMu
	// only: flushes, and so the writers that flush when they outrun the
	// background (afterWriteLocked), go on meanwhile.
	publishMu ctxMutex
	flushMu   sync.Mutex
	// wantPublish: the background loop has lost its turn at publishMu to
	// uploads too often; the uploader pauses until it has had one.
	wantPublish atomic.Bool
	kick        chan struct{}
	stop        chan struct{}
	wg          sync.WaitGroup

	saveMu    sync.Mutex         // one local manifest save at a time
	lastSaved *manifest.Manifest // the local manifest's content as last saved
}

type lsnTime struct {
	t   time.Time
	lsn pg.LSN
}

// layerLSNTimes rebuilds, at Open, the LSN-time history that pitr reads
// (kept in memory, appended at each flush): a layer file last written at
// time T holds versions up to LSNEnd-1, so that LSN existed by T. Without
// it, a pageserver restarted more often than pitr never moved its GC
// cutoff. Files written later than their versions (compaction output,
// downloads after a restart on an empty disk) only keep more history; a
// layer that is not on local disk adds nothing.
func layerLSNTimes(hs []*handle) []lsnTime {
	var out []lsnTime
	for _, h := range hs {
		fi, err := os.Stat(h.path())
		if err != nil || h.desc.LSNEnd == 0 {
			continue
		}
		out = append(out, lsnTime{t: fi.ModTime(), lsn: h.desc.LSNEnd - 1})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].t.Before(out[j].t) })
	return out
}

const (
	manifestFile = "manifest.json"
	logPrefix    = "inmem-"
	logSuffix    = ".log"
)

// Open opens (or creates) the timeline stored in dir. If dir holds no
// manifest and d.Remote is set, the newest manifest in the object store is
// adopted and its layers are fetched on demand. Logs of in-memory layers
// left by a previous run are replayed and flushed.
func Open(ctx context.Context, id pg.TimelineID, dir string, opts Options, d Deps) (*Timeline, error) {
	if d.Commit == nil {
		return nil, errors.New("timeline: Deps.Commit is required")
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Policy == nil {
		d.Policy = WritebackPolicy{}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	opts = opts.withDefaults()
	t := &Timeline{
		id: id, dir: dir, opts: opts, d: d,
		log:         d.Log.With().Str("timeline", id.String()).Logger(),
		pendingKeys: map[keyspace.Key][]layer.Version{},
		memFloor:    map[*layer.InMem]pg.LSN{},
		walWait:     make(chan struct{}),
		cache:       newPageCache(opts.CacheBytes),
		chains:      map[keyspace.Key]int{},
		kick:        make(chan struct{}, 1),
		publishMu:   make(ctxMutex, 1),
		stop:        make(chan struct{}),
	}
	m, err := manifest.LoadLocal(filepath.Join(dir, manifestFile))
	switch {
	case err == nil:
	case errors.Is(err, os.ErrNotExist) && d.Remote != nil:
		m, err = d.Remote.Latest(ctx, id)
		if errors.Is(err, manifest.ErrNoManifest) {
			m, err = nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("timeline %s: reading remote manifest: %w", id, err)
		} else {
			for i := range m.Layers {
				m.Layers[i].Uploaded = true
			}
			t.log.Info().Uint64("generation", m.Generation).Int("layers", len(m.Layers)).Msg("adopted remote manifest")
		}
		t.remoteChecked.Store(true) // the marks come from this store, or there are none
	case errors.Is(err, os.ErrNotExist):
		m, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("timeline %s: %w", id, err)
	}
	var hs []*handle
	if m != nil {
		for _, ld := range m.Layers {
			hs = append(hs, t.newHandle(ld))
		}
		t.gen = m.Generation
		t.gcCutoff = m.GCCutoff
		t.gcCut.Store(uint64(m.GCCutoff))
		t.seq.Store(m.MaxSeq)
		t.lastRecord.Store(uint64(m.DiskConsistentLSN))
		// The local manifest's LSN is the store's only once checkRemote
		// has seen that the store holds what it names.
		if m.Generation > 0 && (d.Remote == nil || t.remoteChecked.Load()) {
			t.remoteLSN.Store(uint64(m.DiskConsistentLSN))
		}
	}
	t.layers = layermap.New(hs)
	for _, h := range hs {
		if h.desc.Kind == layer.ImageLayer {
			t.imageFloor = max(t.imageFloor, h.desc.LSNStart)
		}
	}
	// Before anything in the folder is changed or opened: an older copy
	// is left as it was.
	if err := t.checkRemoteAtOpen(ctx); err != nil {
		return nil, err
	}
	if err := t.removeStrays(hs); err != nil {
		return nil, err
	}
	t.lsnTimes = layerLSNTimes(hs)
	if err := t.replayLogs(); err != nil {
		return nil, err
	}
	// What the files hold survived the restart: durable from the start,
	// so the durable LSN never goes back when buffered ingest resumes.
	t.synced.Store(t.lastRecord.Load())
	if opts.LeaseGrace > 0 && t.lastRecord.Load() > 0 {
		// This pageserver has history here but none of the leases on it.
		t.graceEnd = d.Now().Add(opts.LeaseGrace)
		t.log.Info().Dur("for", opts.LeaseGrace).Msg("GC keeps the cutoff until readers have renewed their leases")
	}
	t.d.Metrics.observeLayers(t)
	if !opts.NoBackground {
		t.wg.Add(1)
		go t.background()
		if d.Remote != nil {
			t.wg.Add(1)
			go t.uploader()
		}
	}
	return t, nil
}

// openCheckTimeout bounds checkRemoteAtOpen: an object store that does not
// answer delays the check to the first upload, not the start.
const openCheckTimeout = 30 * time.Second

// checkRemoteAtOpen runs checkRemote when the timeline was opened from its
// local manifest, before it serves a read: a folder that is an older copy
// of the timeline (another pageserver has published newer layers since)
// would otherwise serve its older pages until its first upload found it
// fenced. That is refused here, with what to do. Any other failure of the
// check (the store unreachable, layers lost from it) leaves it to the
// first upload, as before: the local pages are this timeline's newest.
func (t *Timeline) checkRemoteAtOpen(ctx context.Context) error {
	if t.d.Remote == nil || t.remoteChecked.Load() {
		return nil
	}
	if t.opts.DeferOpenCheck {
		t.log.Warn().Msg("the local manifest is checked against the object store before the first upload, not at open: the store did not answer at the start")
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, openCheckTimeout)
	defer cancel()
	err := t.checkRemote(cctx)
	if errors.Is(err, manifest.ErrFenced) {
		return err
	}
	if err != nil {
		t.log.Warn().Err(err).Msg("checking the local manifest against the object store at open (checked again before the first upload)")
	}
	return nil
}

// removeStrays deletes local files that no manifest names (a crash between
// writing a layer and saving the manifest leaves them; their versions are
// still in the replayed log).
func (t *Timeline) removeStrays(hs []*handle) error {
	known := map[string]bool{}
	for _, h := range hs {
		known[h.desc.Name] = true
	}
	ents, err := os.ReadDir(t.dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		n := e.Name()
		if (layer.ValidName(n) && !known[n]) || strings.HasPrefix(n, "tmp-layer-") || strings.HasSuffix(n, ".download") {
			t.log.Info().Str("file", n).Msg("removing stray file")
			if err := os.Remove(filepath.Join(t.dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (t *Timeline) replayLogs() error {
	floor := pg.LSN(t.lastRecord.Load())
	ents, err := os.ReadDir(t.dir)
	if err != nil {
		return err
	}
	var seqs []uint64
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, logPrefix) && strings.HasSuffix(n, logSuffix) {
			s, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(n, logPrefix), logSuffix), 10, 64)
			if err == nil {
				seqs = append(seqs, s)
			}
		}
	}
	sort.Slice(seqs, func(i, j int) bool { return seqs[i] < seqs[j] })
	for _, s := range seqs {
		m, err := layer.OpenInMem(t.logPath(s), t.d.Now())
		if err != nil {
			return err
		}
		_, _, lsnMin, lsnMax, maxSeq, _ := m.Stats()
		if m.Empty() {
			if err := m.Remove(); err != nil {
				return err
			}
			continue
		}
		if err := m.Freeze(); err != nil {
			return err
		}
		t.frozen = append(t.frozen, m)
		// The manifest's consistent LSN is a record end below every
		// version the logs hold that its layer files do not.
		t.noteFloorLocked(m, floor, lsnMin)
		t.bumpSeq(maxSeq)
		t.advanceLastRecord(lsnMax)
		t.logSeq = s + 1
	}
	if len(seqs) > 0 {
		t.logSeq = max(t.logSeq, seqs[len(seqs)-1]+1)
	}
	return t.newOpenLocked()
}

func (t *Timeline) logPath(s uint64) string {
	return filepath.Join(t.dir, fmt.Sprintf("%s%020d%s", logPrefix, s, logSuffix))
}

// newOpenLocked starts a new open in-memory layer. REQUIRES: t.mu held (or
// no concurrency yet).
func (t *Timeline) newOpenLocked() error {
	m, err := layer.OpenInMem(t.logPath(t.logSeq), t.d.Now())
	if err != nil {
		return err
	}
	t.logSeq++
	t.open = m
	return nil
}

// noteFloorLocked records that versions from lo up were written to the
// in-memory layer m while the timeline's last record LSN was lastRecord.
//
// A layer's floor is where WAL ingest resumes if the layer is lost (a
// crash before its log was synced): at or below every version it holds,
// and the end of a WAL record, because ingest can only start reading WAL
// where a record starts. lo-1 is the first but not the second (versions
// carry the end LSN of their record, so lo-1 lies inside it); the last
// record LSN before the layer's first batch is both for ingested WAL,
// whose versions all lie above it (storeLocked passes WAL ingest's images
// materialized at the last record LSN as above it too: they are made of
// versions stored already). Writes gated by W (writeback) can lie below
// it; for them lo-1 is the floor, as no WAL is read again.
// REQUIRES: t.mu held for writing.
func (t *Timeline) noteFloorLocked(m *layer.InMem, lastRecord, lo pg.LSN) {
	f := lastRecord
	if lo > 0 && lo-1 < f {
		f = lo - 1
	}
	if cur, ok := t.memFloor[m]; !ok || f < cur {
		t.memFloor[m] = f
	}
}

func (t *Timeline) bumpSeq(s uint64) {
	for {
		o := t.seq.Load()
		if s <= o || t.seq.CompareAndSwap(o, s) {
			return
		}
	}
}

func (t *Timeline) advanceLastRecord(l pg.LSN) {
	for {
		o := t.lastRecord.Load()
		if uint64(l) <= o {
			return
		}
		if t.lastRecord.CompareAndSwap(o, uint64(l)) {
			break
		}
	}
	t.walWaitMu.Lock()
	close(t.walWait)
	t.walWait = make(chan struct{})
	t.walWaitMu.Unlock()
}

// ID returns the timeline's ID.
func (t *Timeline) ID() pg.TimelineID { return t.id }

// Ancestor returns the parent timeline and the branch LSN (nil, 0 for a root).
func (t *Timeline) Ancestor() (*Timeline, pg.LSN) { return t.d.Ancestor, t.d.AncestorLSN }

// LSNs are a timeline's positions.
type LSNs struct {
	// LastRecord: the highest LSN ingested or put.
	LastRecord pg.LSN
	// Commit: the commit LSN the gate last saw.
	Commit pg.LSN
	// Durable: every version at or below it that this pageserver accepted
	// survives a restart (it is in the log or in layer files).
	Durable pg.LSN
	// RemoteConsistent: the disk consistent LSN of the last published
	// manifest; what a pageserver on an empty disk would serve.
	RemoteConsistent pg.LSN
	// GCCutoff: reads and branches below it are refused.
	GCCutoff pg.LSN
	// Lease: the lowest LSN a running lease holds GC below (0: none);
	// Leases: how many leases run.
	Lease  pg.LSN
	Leases int
	// Pending: versions waiting for the commit LSN.
	Pending int
}

// LSNs returns the timeline's positions.
func (t *Timeline) LSNs() LSNs {
	t.mu.RLock()
	defer t.mu.RUnlock()
	l := LSNs{
		LastRecord:       pg.LSN(t.lastRecord.Load()),
		Commit:           t.d.Commit.CommitLSN(),
		RemoteConsistent: pg.LSN(t.remoteLSN.Load()),
		GCCutoff:         t.gcCutoff,
		Lease:            t.oldestLeaseLocked(t.d.Now()),
		Leases:           t.runningLeasesLocked(t.d.Now()),
		Pending:          len(t.pending),
	}
	l.Durable = l.LastRecord
	if t.dirty.Load() {
		l.Durable = min(l.Durable, pg.LSN(t.synced.Load()))
	}
	if len(t.pending) > 0 && t.pendingMin <= l.Durable {
		l.Durable = t.pendingMin - 1
	}
	return l
}

// Close stops the background work, flushes the log and closes files. It
// does not flush the in-memory layer to layer files (its log is replayed
// on the next Open).
func (t *Timeline) Close() error {
	// Versions the gate already allows become durable before we go.
	if err := t.CommitAdvanced(); err != nil {
		t.log.Error().Err(err).Msg("releasing gated versions at close")
	}
	if err := t.SyncIngested(); err != nil && !errors.Is(err, ErrClosed) {
		t.log.Error().Err(err).Msg("syncing ingested WAL at close")
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	close(t.stop)
	t.wg.Wait()
	_ = t.publishMu.Lock(context.Background())
	defer t.publishMu.Unlock()
	t.flushMu.Lock()
	defer t.flushMu.Unlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	errs = append(errs, t.open.Close())
	t.open.Release()
	for _, f := range t.frozen {
		errs = append(errs, f.Close())
		f.Release()
	}
	for _, h := range t.layers.All() {
		h.close()
	}
	return errors.Join(errs...)
}

// ctxMutex is a mutex whose Lock gives up when its context ends: an
// upload that must wait for another one (which may wait minutes for a
// slow store) stays within its caller's deadline.
type ctxMutex chan struct{}

// Lock takes m, or returns ctx's error once ctx ends first.
func (m ctxMutex) Lock(ctx context.Context) error {
	select {
	case m <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryLock takes m if it is free.
func (m ctxMutex) TryLock() bool {
	select {
	case m <- struct{}{}:
		return true
	default:
		return false
	}
}

// Unlock releases m.
func (m ctxMutex) Unlock() { <-m }
