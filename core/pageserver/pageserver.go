package pageserver

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/pg"
)

// Sentinel errors.
var (
	// ErrNoTimeline: the timeline does not exist.
	ErrNoTimeline = errors.New("pageserver: no such timeline")
	// ErrTimelineExists: CreateTimeline or Branch with an ID in use.
	ErrTimelineExists = errors.New("pageserver: timeline exists")
	// ErrStaleTerm: a mutation or BeginTerm carries a term below the
	// timeline's current term (the compute was fenced by a newer one).
	ErrStaleTerm = errors.New("pageserver: stale term")
	// ErrNotListed: the object store has not answered since the start, so
	// the pageserver serves the timelines of its disk and does not know
	// which others the store holds (CreateTimeline and Branch wait for
	// it: a new ID could be one of them).
	ErrNotListed = errors.New("pageserver: the object store's timelines are not listed yet")
)

// Deps are the pageserver's collaborators.
type Deps struct {
	Log      zerolog.Logger
	Registry prometheus.Registerer // nil: no metrics
	// Store is the object store (nil: local only, nothing survives disk loss).
	Store objectstore.Store
	// Commit returns the commit LSN source of a timeline. When Commit is
	// nil or returns nil for a timeline, that timeline gets a settable
	// timeline.CommitLSN, advanced with AdvanceCommitLSN.
	Commit func(pg.TimelineID) timeline.CommitLSNSource
	// Redo materializes delta records (nil: none; writeback needs none).
	Redo timeline.Redo
	// AfterWrite (may be nil) is called after every successful Mutate,
	// e.g. to make the commit LSN source poll faster while versions are
	// pending. It must not block.
	AfterWrite func(tl *timeline.Timeline)
}

// Pageserver owns the timelines of one data directory. Safe for concurrent use.
type Pageserver struct {
	cfg     Config
	d       Deps
	remote  *manifest.Remote
	metrics *timeline.Metrics

	incarnation uint64

	// listed: the object store's timelines are known (listed at New, or
	// later by listLater when the store did not answer at New); always
	// true without a store.
	listed    atomic.Bool
	stopList  chan struct{}
	listDone  chan struct{}
	closeOnce sync.Once

	mu        sync.RWMutex
	timelines map[pg.TimelineID]*timeline.Timeline
	commits   map[pg.TimelineID]*timeline.CommitLSN
	fences    map[pg.TimelineID]*fence
}

// fence is a timeline's compute term: mutations hold mu shared, BeginTerm
// exclusively, so no mutation of an older term lands after BeginTerm has
// dropped the pending versions.
type fence struct {
	mu   sync.RWMutex
	term uint64
}

// meta is timelines/<id>/timeline.json: what is needed to open a timeline
// before its manifest (the ancestry).
type meta struct {
	Ancestor    string `json:"ancestor,omitempty"`
	AncestorLSN pg.LSN `json:"ancestor_lsn,omitempty"`
}

// New opens every timeline found in cfg.DataDir and, when a store is given,
// every timeline the object store has a manifest for (a pageserver started
// on an empty disk serves them by fetching layers on demand). When the
// store does not answer within listTimeout (a transient failure or none)
// and the disk holds timelines, New opens those and lists the store in
// the background until it answers; meanwhile CreateTimeline and Branch
// fail with ErrNotListed. Any other failure to list fails New.
func New(ctx context.Context, cfg Config, d Deps) (*Pageserver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p := &Pageserver{cfg: cfg, d: d, timelines: map[pg.TimelineID]*timeline.Timeline{},
		commits: map[pg.TimelineID]*timeline.CommitLSN{}, fences: map[pg.TimelineID]*fence{}}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	p.incarnation = binary.LittleEndian.Uint64(b[:]) | 1 // never 0
	if d.Store != nil {
		p.remote = &manifest.Remote{Store: d.Store, Parallel: cfg.UploadParallelism}
	}
	if d.Registry != nil {
		p.metrics = timeline.NewMetrics(d.Registry)
	}
	metas := map[pg.TimelineID]meta{}
	ents, err := os.ReadDir(filepath.Join(cfg.DataDir, "timelines"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	for _, e := range ents {
		id, err := pg.ParseTimelineID(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(p.dir(id), "timeline.json"))
		if err != nil {
			return nil, fmt.Errorf("pageserver: timeline %s: %w", id, err)
		}
		var m meta
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("pageserver: timeline %s: %w", id, err)
		}
		metas[id] = m
	}
	switch {
	case p.remote == nil:
		p.listed.Store(true)
	default:
		lctx, cancel := context.WithTimeout(ctx, listTimeout)
		err := p.addRemote(lctx, metas)
		cancel()
		switch {
		case err == nil:
			p.listed.Store(true)
		case len(metas) > 0 && ctx.Err() == nil && manifest.Unanswered(err):
			// A restart while the store is out: the disk holds these
			// timelines, the safekeepers the WAL; the uploads wait for
			// the store, as they do when it fails while running.
			p.d.Log.Warn().Err(err).Int("local_timelines", len(metas)).Dur("retry_every", listEvery).
				Msg("the object store does not answer: serving the timelines on this disk; the store's own list is read again in the background, and new timelines wait for it")
		default:
			return nil, fmt.Errorf("pageserver: listing remote timelines: %w", err)
		}
	}
	if err := p.openAll(ctx, metas); err != nil {
		p.Close()
		return nil, err
	}
	if !p.listed.Load() {
		p.stopList, p.listDone = make(chan struct{}), make(chan struct{})
		go p.listLater()
	}
	p.updateRetain()
	return p, nil
}

// listTimeout bounds one listing of the store's timelines; listEvery is
// the wait between two while the store has not answered since New (a
// variable for the tests).
const listTimeout = 15 * time.Second

var listEvery = 10 * time.Second

// addRemote adds to metas every timeline the object store has a manifest
// for and metas lacks, writing its timeline.json.
func (p *Pageserver) addRemote(ctx context.Context, metas map[pg.TimelineID]meta) error {
	ids, err := p.remote.Timelines(ctx)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if _, ok := metas[id]; ok {
			continue
		}
		m, err := p.remote.Latest(ctx, id)
		if err != nil {
			return err
		}
		mt := meta{Ancestor: m.Ancestor, AncestorLSN: m.AncestorLSN}
		if err := p.writeMeta(id, mt); err != nil {
			return err
		}
		metas[id] = mt
	}
	return nil
}

// openAll opens every timeline of metas that is not open yet, ancestors
// before their branches (an ancestor already open needs no entry of its
// own). The caller holds p.mu, or is New.
func (p *Pageserver) openAll(ctx context.Context, metas map[pg.TimelineID]meta) error {
	var open func(id pg.TimelineID, depth int) error
	open = func(id pg.TimelineID, depth int) error {
		if _, ok := p.timelines[id]; ok {
			return nil
		}
		m := metas[id]
		var anc *timeline.Timeline
		if m.Ancestor != "" {
			aid, err := pg.ParseTimelineID(m.Ancestor)
			if err != nil {
				return err
			}
			_, known := metas[aid]
			if _, ok := p.timelines[aid]; !ok && !known || depth > 1000 {
				return fmt.Errorf("pageserver: timeline %s: ancestor %s missing", id, aid)
			}
			if err := open(aid, depth+1); err != nil {
				return err
			}
			anc = p.timelines[aid]
		}
		tl, err := p.openTimeline(ctx, id, anc, m.AncestorLSN)
		if err != nil {
			return err
		}
		p.timelines[id] = tl
		return nil
	}
	for id := range metas {
		if err := open(id, 0); err != nil {
			return err
		}
	}
	return nil
}

// listLater lists the object store's timelines every listEvery until it
// answers, then opens the ones this disk lacks: New started on the local
// timelines alone because the store did not answer.
func (p *Pageserver) listLater() {
	defer close(p.listDone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-p.stopList:
			cancel()
		case <-ctx.Done():
		}
	}()
	since := time.Now()
	for tries := 1; ; tries++ {
		select {
		case <-p.stopList:
			return
		case <-time.After(listEvery):
		}
		opened, err := p.listNow(ctx)
		if err == nil {
			p.d.Log.Info().Int("opened_from_store", opened).Dur("after", time.Since(since).Round(time.Second)).
				Msg("the object store answers: its timelines are listed, and new timelines can be made again")
			return
		}
		if ctx.Err() != nil {
			return
		}
		if tries%6 == 0 {
			p.d.Log.Warn().Err(err).Dur("since", time.Since(since).Round(time.Second)).
				Msg("the object store still does not answer: its timelines are not listed yet (serving the ones on this disk)")
		}
	}
}

// listNow adds and opens the store's timelines that are not open, and
// marks the store listed. It returns how many it opened.
func (p *Pageserver) listNow(ctx context.Context) (int, error) {
	metas := map[pg.TimelineID]meta{}
	p.mu.RLock()
	for id := range p.timelines {
		metas[id] = meta{}
	}
	p.mu.RUnlock()
	lctx, cancel := context.WithTimeout(ctx, listTimeout)
	defer cancel()
	if err := p.addRemote(lctx, metas); err != nil {
		return 0, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	before := len(p.timelines)
	err := p.openAll(ctx, metas)
	p.updateRetainLocked()
	if err != nil {
		return len(p.timelines) - before, err
	}
	p.listed.Store(true)
	return len(p.timelines) - before, nil
}

func (p *Pageserver) dir(id pg.TimelineID) string {
	return filepath.Join(p.cfg.DataDir, "timelines", id.String())
}

func (p *Pageserver) writeMeta(id pg.TimelineID, m meta) error {
	if err := os.MkdirAll(p.dir(id), 0o755); err != nil {
		return err
	}
	b, _ := json.Marshal(m)
	tmp := filepath.Join(p.dir(id), "timeline.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(p.dir(id), "timeline.json"))
}

func (p *Pageserver) openTimeline(ctx context.Context, id pg.TimelineID, anc *timeline.Timeline, ancLSN pg.LSN) (*timeline.Timeline, error) {
	var commit timeline.CommitLSNSource
	if p.d.Commit != nil {
		commit = p.d.Commit(id)
	}
	if commit == nil {
		c := &timeline.CommitLSN{}
		p.commits[id] = c
		commit = c
	}
	term, err := p.loadTerm(id)
	if err != nil {
		return nil, err
	}
	p.fences[id] = &fence{term: term}
	opts := p.cfg.Options()
	opts.DeferOpenCheck = !p.listed.Load()
	return timeline.Open(ctx, id, p.dir(id), opts, timeline.Deps{
		Log: p.d.Log, Commit: commit, Redo: p.d.Redo, Policy: p.cfg.Policy(),
		Remote: p.remote, Metrics: p.metrics, Ancestor: anc, AncestorLSN: ancLSN,
	})
}

// Timeline returns an open timeline or ErrNoTimeline.
func (p *Pageserver) Timeline(id pg.TimelineID) (*timeline.Timeline, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	tl, ok := p.timelines[id]
	if !ok {
		if !p.listed.Load() {
			return nil, fmt.Errorf("%w: %s is not on this pageserver's disk, and %w (the object store, which may hold it, has not answered since the start)", ErrNoTimeline, id, ErrNotListed)
		}
		return nil, fmt.Errorf("%w: %s", ErrNoTimeline, id)
	}
	return tl, nil
}

// CreateTimeline creates an empty root timeline.
func (p *Pageserver) CreateTimeline(ctx context.Context, id pg.TimelineID) (*timeline.Timeline, error) {
	return p.create(ctx, id, pg.TimelineID{}, 0)
}

// Branch creates timeline id as a branch of parent at LSN at: it reads the
// parent's history at or below at. at must lie between the parent's GC
// cutoff and its durable LSN; LatestLSN (or 0) branches at the durable LSN.
func (p *Pageserver) Branch(ctx context.Context, parent, id pg.TimelineID, at pg.LSN) (*timeline.Timeline, error) {
	return p.create(ctx, id, parent, at)
}

func (p *Pageserver) create(ctx context.Context, id, parent pg.TimelineID, at pg.LSN) (*timeline.Timeline, error) {
	if id.IsZero() {
		return nil, fmt.Errorf("pageserver: zero timeline id")
	}
	if !p.listed.Load() {
		return nil, fmt.Errorf("%w (the object store has not answered since the start): timeline %s could be one of them, so it is not made before the store answers (asked every %s)", ErrNotListed, id, listEvery)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.timelines[id]; ok {
		return nil, fmt.Errorf("%w: %s", ErrTimelineExists, id)
	}
	var anc *timeline.Timeline
	m := meta{}
	if !parent.IsZero() {
		var ok bool
		if anc, ok = p.timelines[parent]; !ok {
			return nil, fmt.Errorf("%w: parent %s", ErrNoTimeline, parent)
		}
		l := anc.LSNs()
		if at == 0 || at == timeline.LatestLSN {
			at = l.Durable
		}
		// The check against the parent's GC cutoff is a lease, held until
		// the branch point is registered (updateRetainLocked): a GC round
		// cannot pass at in between.
		holder := "branch " + id.String()
		if _, err := anc.Lease(at, holder, time.Minute); err != nil {
			if errors.Is(err, timeline.ErrBelowGCCutoff) {
				return nil, fmt.Errorf("%w: branch at %s, parent cutoff %s", timeline.ErrBelowGCCutoff, at, anc.LSNs().GCCutoff)
			}
			return nil, err
		}
		defer anc.Lease(at, holder, 0)
		// Versions above the durable LSN may still vanish (gated writes
		// lost in a crash); a branch must not see them.
		if at > l.Durable {
			return nil, fmt.Errorf("pageserver: branch at %s is past the parent's durable LSN %s", at, l.Durable)
		}
		m = meta{Ancestor: parent.String(), AncestorLSN: at}
	}
	if err := p.writeMeta(id, m); err != nil {
		return nil, err
	}
	tl, err := p.openTimeline(ctx, id, anc, at)
	if err != nil {
		return nil, err
	}
	p.timelines[id] = tl
	p.updateRetainLocked()
	// Publish generation 1 at once so the timeline (and its ancestry)
	// survives the loss of the local disk.
	if p.remote != nil {
		if err := tl.Upload(ctx); err != nil {
			p.d.Log.Warn().Err(err).Stringer("timeline", id).Msg("initial manifest upload failed; retried in background")
		}
	}
	return tl, nil
}

func (p *Pageserver) updateRetain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.updateRetainLocked()
}

func (p *Pageserver) updateRetainLocked() {
	retain := map[*timeline.Timeline][]pg.LSN{}
	for _, tl := range p.timelines {
		if a, at := tl.Ancestor(); a != nil {
			retain[a] = append(retain[a], at)
		}
	}
	for _, tl := range p.timelines {
		tl.SetRetainLSNs(retain[tl])
	}
}

// AdvanceCommitLSN raises the commit LSN of a timeline whose commit LSN
// source is the built-in settable one, and releases gated versions.
func (p *Pageserver) AdvanceCommitLSN(id pg.TimelineID, lsn pg.LSN) error {
	p.mu.RLock()
	c, ok := p.commits[id]
	tl := p.timelines[id]
	p.mu.RUnlock()
	if tl == nil {
		return fmt.Errorf("%w: %s", ErrNoTimeline, id)
	}
	if !ok {
		return fmt.Errorf("pageserver: timeline %s takes its commit LSN from the safekeepers", id)
	}
	c.Set(lsn)
	return tl.CommitAdvanced()
}

// Timelines returns the open timelines sorted by ID.
func (p *Pageserver) Timelines() []*timeline.Timeline {
	p.mu.RLock()
	defer p.mu.RUnlock()
	out := make([]*timeline.Timeline, 0, len(p.timelines))
	for _, tl := range p.timelines {
		out = append(out, tl)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID().String() < out[j].ID().String() })
	return out
}

// Close closes every timeline (children first).
func (p *Pageserver) Close() error {
	p.closeOnce.Do(func() {
		if p.stopList != nil {
			close(p.stopList)
			<-p.listDone
		}
	})
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	closed := map[pg.TimelineID]bool{}
	for len(closed) < len(p.timelines) {
		progress := false
		for id, tl := range p.timelines {
			if closed[id] {
				continue
			}
			busy := false
			for cid, c := range p.timelines {
				if a, _ := c.Ancestor(); a == tl && !closed[cid] {
					busy = true
				}
			}
			if !busy {
				errs = append(errs, tl.Close())
				closed[id] = true
				progress = true
			}
		}
		if !progress {
			break
		}
	}
	return errors.Join(errs...)
}

// Incarnation returns this process's incarnation: a random non-zero number
// drawn at New. Pending versions live in memory only, so a compute that
// sees the incarnation change knows that every version it wrote above the
// durable LSN it last saw under the old incarnation is lost.
func (p *Pageserver) Incarnation() uint64 { return p.incarnation }

const termFile = "term.json"

func (p *Pageserver) loadTerm(id pg.TimelineID) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(p.dir(id), termFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var v struct {
		Term uint64 `json:"term"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return 0, fmt.Errorf("pageserver: timeline %s: %s: %w", id, termFile, err)
	}
	return v.Term, nil
}

// saveTerm writes term.json durably (write, fsync, rename, fsync the folder).
func (p *Pageserver) saveTerm(id pg.TimelineID, term uint64) error {
	dir := p.dir(id)
	tmp := filepath.Join(dir, termFile+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "{\"term\":%d}\n", term)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, termFile)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (p *Pageserver) fenceOf(id pg.TimelineID) (*timeline.Timeline, *fence, error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	tl, ok := p.timelines[id]
	if !ok {
		return nil, nil, fmt.Errorf("%w: %s", ErrNoTimeline, id)
	}
	return tl, p.fences[id], nil
}

// Term returns the timeline's current compute term (0: never set).
func (p *Pageserver) Term(id pg.TimelineID) (uint64, error) {
	_, f, err := p.fenceOf(id)
	if err != nil {
		return 0, err
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.term, nil
}

// BeginTerm is called by a compute that won the safekeeper election for
// term (> 0) with durable end e (the end of the WAL the quorum agreed on).
// It drops every pending version with W above e (a dead compute's writes
// whose WAL the new term overwrites), remembers term durably in the
// timeline's folder, and from then on Mutate refuses lower non-zero terms.
// A term below the current one fails with ErrStaleTerm; the current term
// again is a no-op (a retried call), so the compute must call it once,
// before its first write. It returns the number of dropped versions.
func (p *Pageserver) BeginTerm(id pg.TimelineID, term uint64, e pg.LSN) (int, error) {
	if term == 0 {
		return 0, fmt.Errorf("pageserver: BeginTerm with term 0")
	}
	tl, f, err := p.fenceOf(id)
	if err != nil {
		return 0, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case term < f.term:
		return 0, fmt.Errorf("%w: term %d, timeline %s is at %d", ErrStaleTerm, term, id, f.term)
	case term == f.term:
		return 0, nil
	}
	n := tl.DropPending(e)
	if err := p.saveTerm(id, term); err != nil {
		return n, fmt.Errorf("pageserver: saving term of %s: %w", id, err)
	}
	f.term = term
	p.d.Log.Info().Stringer("timeline", id).Uint64("term", term).Stringer("durable_end", e).Int("dropped", n).Msg("compute term begins")
	return n, nil
}

// Mutate runs fn, a write to timeline id on behalf of a compute of term
// (0: unfenced), unless term is below the timeline's current term
// (ErrStaleTerm). BeginTerm waits for running mutations and blocks new ones.
func (p *Pageserver) Mutate(id pg.TimelineID, term uint64, fn func(tl *timeline.Timeline) error) error {
	tl, f, err := p.fenceOf(id)
	if err != nil {
		return err
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if term != 0 && term < f.term {
		return fmt.Errorf("%w: term %d, timeline %s is at %d", ErrStaleTerm, term, id, f.term)
	}
	if err := fn(tl); err != nil {
		return err
	}
	if p.d.AfterWrite != nil {
		p.d.AfterWrite(tl)
	}
	return nil
}
