package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stratadb/strata/core/compute/fusefs"
	"github.com/stratadb/strata/core/compute/prewarm"
	"github.com/stratadb/strata/sdk/pg"
)

// prewarmWorkers is the number of concurrent page reads of a prewarm.
const prewarmWorkers = 4

// PrewarmReport is the last start's prewarm of the LFC (Report.Prewarm).
type PrewarmReport struct {
	// State is "pending" (Postgres is not up yet), "loading", "done",
	// "failed", "none" (no list was saved) or "off"; "autoprewarm" under
	// the shared-buffers strategy, where Postgres' pg_prewarm does it.
	State string `json:"state"`
	// List is the object the pages came from.
	List    string `json:"list,omitempty"`
	Total   int    `json:"total"`
	Loaded  int    `json:"loaded"`
	Cached  int    `json:"cached"`
	Skipped int    `json:"skipped"`
	Took    string `json:"took,omitempty"`
	Error   string `json:"error,omitempty"`
	// Saved is the object key of the last list this compute saved.
	Saved string `json:"saved,omitempty"`
}

// prewarmer loads the LFC from the timeline's saved page list after every
// start and saves the list every interval and when the compute stops.
type prewarmer struct {
	a     *Agent
	pages *prometheus.CounterVec
	mu    sync.Mutex
	rep   PrewarmReport
	// settled: this start's load has ended other than by a cancel. Until
	// then the LFC holds part of the saved list at most, and saving it
	// would replace the list with that part.
	settled bool
	// start numbers the runs: a run's updates count only while it is the
	// current one (a run cut off by a restart may end after the next one
	// began).
	start uint64
	// saved, savedSum: the list this agent saved last (prewarm.Sum), so
	// that an unchanged LFC is not saved again.
	saved    bool
	savedSum uint64
}

func newPrewarmer(a *Agent) *prewarmer {
	p := &prewarmer{a: a, rep: PrewarmReport{State: "off"},
		pages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_compute_prewarm_pages_total",
			Help: "Pages of the saved page list handled by the LFC prewarm after a start: loaded, already cached, or skipped (gone or written meanwhile).",
		}, []string{"result"})}
	if p.enabled() {
		p.rep.State = "pending"
	}
	return p
}

// enabled says whether this compute prewarms: the LFC strategy, prewarm on,
// and an object store to keep the list in.
func (p *prewarmer) enabled() bool {
	c := p.a.cfg
	return c.Cache.Strategy == StrategyLFC && c.Cache.Prewarm && c.Archive != nil
}

func (p *prewarmer) report() *PrewarmReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rep
	return &r
}

// run loads the list into the LFC of the current start, then saves the
// LFC's pages every interval until ctx ends.
func (p *prewarmer) run(ctx context.Context, f *fusefs.FS) {
	if !p.enabled() || f == nil {
		return
	}
	p.mu.Lock()
	p.start++
	id := p.start
	p.settled = false
	p.rep.State = "pending"
	p.mu.Unlock()
	p.load(ctx, f, id)
	p.mu.Lock()
	if p.start == id {
		p.settled = ctx.Err() == nil
	}
	p.mu.Unlock()
	every(ctx, p.a.cfg.Cache.PrewarmInterval, func() { p.save(ctx) })
}

func (p *prewarmer) load(ctx context.Context, f *fusefs.FS, id uint64) {
	a := p.a
	t0 := time.Now()
	keys, name, err := prewarm.Load(ctx, a.cfg.Archive, a.cfg.Timeline)
	if errors.Is(err, prewarm.ErrNone) {
		p.set(id, PrewarmReport{State: "none"})
		a.log.Info().Msg("LFC prewarm: no page list saved yet for this timeline")
		return
	}
	if err != nil {
		p.set(id, PrewarmReport{State: "failed", List: name, Error: err.Error()})
		a.log.Warn().Err(err).Msg("LFC prewarm: the saved page list cannot be read; starting with an empty LFC")
		return
	}
	if limit := int(a.sizing.LFCBytes / pg.BlockSize); len(keys) > limit {
		keys = keys[:limit]
	}
	p.set(id, PrewarmReport{State: "loading", List: name, Total: len(keys)})
	a.log.Info().Str("list", name).Int("pages", len(keys)).Msg("LFC prewarm: loading the saved page list")
	last := time.Now()
	s, err := f.Prewarm(ctx, keys, prewarmWorkers, func(s fusefs.PrewarmStats) {
		p.progress(id, s, "loading", nil)
		if time.Since(last) >= 10*time.Second {
			last = time.Now()
			a.log.Info().Int("done", s.Done()).Int("total", s.Total).Int("loaded", s.Loaded).Dur("elapsed", s.Elapsed.Round(time.Millisecond)).Msg("LFC prewarm")
		}
	})
	p.pages.WithLabelValues("loaded").Add(float64(s.Loaded))
	p.pages.WithLabelValues("cached").Add(float64(s.Cached))
	p.pages.WithLabelValues("skipped").Add(float64(s.Skipped))
	state := "done"
	if err != nil {
		state = "failed"
	}
	p.progress(id, s, state, err)
	ev := a.log.Info()
	if err != nil {
		if ctx.Err() != nil {
			ev = a.log.Info().Str("stopped", "the compute stops or restarts")
		} else {
			ev = a.log.Warn().Err(err)
		}
	}
	ev.Str("list", name).Int("loaded", s.Loaded).Int("cached", s.Cached).Int("skipped", s.Skipped).Int("total", s.Total).
		Dur("took", time.Since(t0).Round(time.Millisecond)).Msg("LFC prewarm finished")
}

func (p *prewarmer) progress(id uint64, s fusefs.PrewarmStats, state string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.start != id {
		return
	}
	p.rep.State, p.rep.Total, p.rep.Loaded, p.rep.Cached, p.rep.Skipped = state, s.Total, s.Loaded, s.Cached, s.Skipped
	p.rep.Took = s.Elapsed.Round(time.Millisecond).String()
	if err != nil {
		p.rep.Error = err.Error()
	}
}

func (p *prewarmer) set(id uint64, r PrewarmReport) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.start != id {
		return
	}
	r.Saved = p.rep.Saved
	p.rep = r
}

// save stores the LFC's pages as the timeline's newest list. It keeps the
// saved list until this start's load has settled (the LFC holds part of
// the list at most) and when the LFC is empty.
func (p *prewarmer) save(ctx context.Context) {
	a := p.a
	if !p.enabled() {
		return
	}
	a.mu.Lock()
	l := a.lfc
	a.mu.Unlock()
	p.mu.Lock()
	settled := p.settled
	p.mu.Unlock()
	if l == nil || !settled {
		return
	}
	keys := l.Keys(0)
	if len(keys) == 0 {
		return
	}
	sum := prewarm.Sum(keys)
	p.mu.Lock()
	same := p.saved && sum == p.savedSum
	p.mu.Unlock()
	if same {
		return // the saved list is this one
	}
	name, err := prewarm.Save(ctx, a.cfg.Archive, a.cfg.Timeline, keys, time.Now())
	if err != nil {
		a.log.Warn().Err(err).Msg("LFC prewarm: saving the page list failed; the last saved list stays")
		return
	}
	p.mu.Lock()
	p.rep.Saved, p.saved, p.savedSum = name, true, sum
	p.mu.Unlock()
	a.log.Info().Str("list", name).Int("pages", len(keys)).Msg("LFC prewarm: page list saved")
}
