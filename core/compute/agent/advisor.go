package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/pluginhost"
	"github.com/stratadb/strata/sdk/cache"
)

// AdvisorConfig is compute.cache.advisor: an external cache advisor plugin
// (sdk/cache.Advisor over go-plugin) that sizes the LFC once a period. It
// is never on the per-page path.
type AdvisorConfig struct {
	// Plugin is the binary, its checksum, arguments and config section.
	Plugin pluginhost.Spec
	// Every is the period between two calls (default 5s).
	Every time.Duration
	// CallTimeout bounds one call (default: the period, at least 2s).
	// After hungCalls calls in a row run out of it, the plugin is taken
	// for hung: it is killed and launched again at the next period.
	CallTimeout time.Duration
}

// hungCalls is how many calls in a row may time out before the advisor
// plugin is killed and launched again.
const hungCalls = 3

// advisorHost runs the compute's external cache advisor: one plugin
// process for the agent's life, launched at the first call and again after
// it dies, asked once a period how large the LFC of the current start
// should be (cache.RunAdvisor). While the plugin is down the LFC keeps its
// capacity; launches that fail are retried with a doubling pause (one
// period up to a minute).
type advisorHost struct {
	cfg   AdvisorConfig
	base  zerolog.Logger // the agent's (RunAdvisor adds the component)
	log   zerolog.Logger
	calls *prometheus.CounterVec

	mu         sync.Mutex
	proc       *pluginhost.Process
	client     *cache.AdvisorGRPCClient
	failures   int           // launches in a row that failed
	timeouts   int           // calls in a row that ran out of CallTimeout
	launching  bool          // a launch runs (without the lock)
	launchDone chan struct{} // closed when that launch has ended
	closed     bool          // close was called: no more launches
	lastErr    error         // why the last launch or call failed
	retryAt    time.Time     // no launch before this
	launches   int
}

func newAdvisorHost(cfg AdvisorConfig, log zerolog.Logger) *advisorHost {
	if cfg.Every <= 0 {
		cfg.Every = 5 * time.Second
	}
	if cfg.Plugin.Name == "" {
		cfg.Plugin.Name = "cache-advisor"
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = max(cfg.Every, 2*time.Second)
	}
	return &advisorHost{cfg: cfg, base: log, log: log.With().Str("component", "cache-advisor").Logger(),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_compute_cache_advisor_calls_total",
			Help: "Calls to the external cache advisor plugin by result: ok, failed (the plugin answered an error or died), down (no plugin process to ask).",
		}, []string{"result"})}
}

// Advise implements cache.Advisor by asking the plugin process, launched
// first when there is none.
func (h *advisorHost) Advise(ctx context.Context, obs cache.Observation) (cache.Advice, error) {
	c, err := h.get(ctx)
	if err != nil {
		h.calls.WithLabelValues("down").Inc()
		return cache.Advice{}, err
	}
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	adv, err := c.Advise(cctx, obs)
	// Past the deadline counts even before the context's timer has fired
	// (a loaded machine), when gRPC reports the server's reset instead.
	deadline, _ := cctx.Deadline()
	timedOut := err != nil && ctx.Err() == nil && (cctx.Err() != nil || !time.Now().Before(deadline))
	cancel()
	if err != nil {
		h.calls.WithLabelValues("failed").Inc()
		if timedOut {
			err = fmt.Errorf("no answer within %s: %w", h.cfg.CallTimeout, err)
		}
		h.mu.Lock()
		h.lastErr = err
		if timedOut {
			h.timeouts++
		} else {
			h.timeouts = 0
		}
		var dead *pluginhost.Process
		switch {
		case h.proc != nil && h.proc.Exited():
			dead = h.dropLocked("the cache advisor plugin exited")
		case h.proc != nil && h.timeouts >= hungCalls:
			h.timeouts = 0
			dead = h.dropLocked(fmt.Sprintf("the cache advisor plugin did not answer %d calls in a row: killing it", hungCalls))
		}
		h.mu.Unlock()
		if dead != nil {
			// Not under the lock: a plugin that does not answer takes
			// go-plugin's grace period (2 s) to die, and the agent's
			// report (status) would wait for it.
			dead.Kill()
		}
		return cache.Advice{}, fmt.Errorf("cache advisor %s: %w", h.cfg.Plugin.Name, err)
	}
	h.mu.Lock()
	h.timeouts = 0
	h.mu.Unlock()
	h.calls.WithLabelValues("ok").Inc()
	return adv, nil
}

// get returns the client of a running plugin, launching one if needed.
// The launch runs without the lock, so that the agent's report (status)
// does not wait for a plugin that is slow to start.
func (h *advisorHost) get(ctx context.Context) (*cache.AdvisorGRPCClient, error) {
	h.mu.Lock()
	for h.launching {
		// Another call is launching the plugin: wait for its outcome.
		done := h.launchDone
		h.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		h.mu.Lock()
	}
	if h.proc != nil && h.proc.Exited() {
		h.dropLocked("the cache advisor plugin exited").Kill() // exited: Kill only reaps
	}
	switch now := time.Now(); {
	case h.proc != nil:
		c := h.client
		h.mu.Unlock()
		return c, nil
	case h.closed:
		h.mu.Unlock()
		return nil, fmt.Errorf("cache advisor %s: %w", h.cfg.Plugin.Name, cache.ErrClosed)
	case now.Before(h.retryAt):
		err := fmt.Errorf("cache advisor %s: not running (%v); next launch in %s", h.cfg.Plugin.Name, h.lastErr, h.retryAt.Sub(now).Round(time.Second))
		h.mu.Unlock()
		return nil, err
	}
	h.launching, h.launchDone = true, make(chan struct{})
	h.mu.Unlock()

	p, c, err := h.launch(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.launching = false
	close(h.launchDone)
	if err == nil && h.closed {
		p.Kill()
		return nil, fmt.Errorf("cache advisor %s: %w", h.cfg.Plugin.Name, cache.ErrClosed)
	}
	if err == nil {
		h.proc, h.client = p, c
		h.failures = 0
		h.launches++
		h.log.Info().Int("pid", p.PID()).Int("launches", h.launches).Msg("cache advisor plugin running")
		return c, nil
	}
	h.failures++
	h.lastErr = err
	pause := h.cfg.Every
	for i := 1; i < h.failures && pause < time.Minute; i++ {
		pause *= 2
	}
	h.retryAt = time.Now().Add(min(pause, time.Minute))
	h.log.Error().Err(err).Dur("retry_in", min(pause, time.Minute)).Msg("cache advisor plugin did not start; the LFC keeps its capacity")
	return nil, err
}

// launch starts the plugin and configures it (bounded by CallTimeout).
func (h *advisorHost) launch(ctx context.Context) (*pluginhost.Process, *cache.AdvisorGRPCClient, error) {
	p, err := pluginhost.Launch(h.cfg.Plugin, cache.AdvisorPluginKind, cache.AdvisorProtocolVersion, &cache.AdvisorGRPCPlugin{}, pluginhost.Options{}, h.log)
	if err != nil {
		return nil, nil, err
	}
	c, ok := p.Client().(*cache.AdvisorGRPCClient)
	if !ok {
		p.Kill()
		return nil, nil, fmt.Errorf("cache advisor %s: the plugin served %T, not a cache advisor", h.cfg.Plugin.Name, p.Client())
	}
	cctx, cancel := context.WithTimeout(ctx, h.cfg.CallTimeout)
	defer cancel()
	if err := c.Configure(cctx, h.cfg.Plugin.ConfigJSON); err != nil {
		p.Kill()
		return nil, nil, fmt.Errorf("cache advisor %s: the plugin refused its config: %w", h.cfg.Plugin.Name, err)
	}
	return p, c, nil
}

// dropLocked forgets the running plugin and returns its process, for the
// caller to kill (after unlocking, when it may still be alive).
func (h *advisorHost) dropLocked(why string) *pluginhost.Process {
	p := h.proc
	h.log.Warn().Int("pid", p.PID()).Msg(why + "; launching it again at the next period")
	h.proc, h.client = nil, nil
	return p
}

// status is the plugin's state for the agent's report.
func (h *advisorHost) status() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case h.launching:
		return "starting"
	case h.proc != nil:
		return fmt.Sprintf("running (pid %d, every %s, %d launches)", h.proc.PID(), h.cfg.Every, h.launches)
	case h.lastErr != nil:
		return "down: " + h.lastErr.Error()
	default:
		return "not started yet"
	}
}

// close stops the plugin process.
func (h *advisorHost) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.proc != nil {
		h.proc.Kill()
		h.proc, h.client = nil, nil
	}
}

// run sizes c with the advisor until ctx ends or c is closed.
func (h *advisorHost) run(ctx context.Context, c cache.Cache, budget int64, waits *cache.Waits) {
	err := cache.RunAdvisor(ctx, c, h, cache.AdvisorOptions{Every: h.cfg.Every, BudgetBytes: budget, Waits: waits, Logger: h.base})
	h.log.Debug().Err(err).Msg("cache advisor loop ended")
}
