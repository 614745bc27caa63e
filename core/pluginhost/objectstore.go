package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/stratadb/strata/sdk/objectstore"
)

// ObjectStore is an objectstore.Store served by an external plugin process.
//
// Crashes: when the process dies (killed, crashed, or stopped answering),
// the calls in flight fail with an error that names the plugin and its pid
// ("objectstore plugin \"fs\" (pid 4242) exited: ...") and matches
// objectstore.ErrTransient, so the retry wrapper repeats them. The next
// call starts a new process (after a backoff, see Options) and configures
// it again with the same config; what the old process held in memory is
// gone, what its backend stored is not.
//
// It is safe for concurrent use.
type ObjectStore struct {
	spec Spec
	opts Options
	log  zerolog.Logger

	cur    atomic.Pointer[osInstance] // nil when no process is running
	closed atomic.Bool
	sem    chan struct{} // held while (re)starting

	mu          sync.Mutex
	failures    int         // consecutive crashes or failed starts; guarded by mu
	lastFailure time.Time   // when the last one happened; guarded by mu
	anyFailures atomic.Bool // failures > 0, readable without mu
	restarts    atomic.Int64
}

var _ objectstore.Store = (*ObjectStore)(nil)

type osInstance struct {
	proc  *process
	store *objectstore.GRPCClient
}

// OpenObjectStore starts the plugin of spec, checks its handshake, protocol
// version and checksum, hands it spec.ConfigJSON, and returns the Store it
// serves. A plugin that cannot start, has the wrong checksum or speaks
// another protocol version is a clear error naming the plugin (ErrChecksum,
// ErrVersion). ctx bounds the Configure call; starting the process is
// bounded by Options.StartTimeout. Close stops the process.
func OpenObjectStore(ctx context.Context, spec Spec, log zerolog.Logger) (*ObjectStore, error) {
	return OpenObjectStoreOptions(ctx, spec, Options{}, log)
}

// OpenObjectStoreOptions is OpenObjectStore with tuning options.
func OpenObjectStoreOptions(ctx context.Context, spec Spec, opts Options, log zerolog.Logger) (*ObjectStore, error) {
	if spec.Name == "" {
		spec.Name = filepath.Base(spec.Path)
	}
	s := &ObjectStore{spec: spec, opts: opts.withDefaults(), log: log, sem: make(chan struct{}, 1)}
	inst, err := s.start(ctx)
	if err != nil {
		return nil, err
	}
	s.cur.Store(inst)
	return s, nil
}

func (s *ObjectStore) start(ctx context.Context) (*osInstance, error) {
	proc, err := launch(s.spec, objectstore.PluginKind, objectstore.PluginProtocolVersion, &objectstore.GRPCPlugin{}, s.opts, s.log)
	if err != nil {
		return nil, err
	}
	store, ok := proc.raw.(*objectstore.GRPCClient)
	if !ok {
		proc.kill()
		return nil, fmt.Errorf("pluginhost: objectstore plugin %q: dispensed %T, want *objectstore.GRPCClient", s.spec.Name, proc.raw)
	}
	if err := store.Configure(ctx, s.spec.ConfigJSON); err != nil {
		proc.kill()
		if status.Code(err) == codes.Unimplemented {
			return nil, fmt.Errorf("pluginhost: objectstore plugin %q (%s) is not an objectstore plugin (a strata plugin of another kind?): %w",
				s.spec.Name, s.spec.Path, err)
		}
		return nil, fmt.Errorf("pluginhost: objectstore plugin %q (pid %d) refused its config: %w", s.spec.Name, proc.pid, err)
	}
	return &osInstance{proc: proc, store: store}, nil
}

// PID is the process id of the running plugin, or 0 when none runs.
func (s *ObjectStore) PID() int {
	if inst := s.cur.Load(); inst != nil {
		return inst.proc.pid
	}
	return 0
}

// Restarts is how many times the plugin was restarted after a crash.
func (s *ObjectStore) Restarts() int64 { return s.restarts.Load() }

// acquire returns the running instance, restarting the plugin if it died.
func (s *ObjectStore) acquire(ctx context.Context) (*osInstance, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("pluginhost: objectstore plugin %q: %w", s.spec.Name, objectstore.ErrClosed)
	}
	if inst := s.cur.Load(); inst != nil && !inst.proc.exited() {
		return inst, nil
	}
	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.sem }()
	if s.closed.Load() {
		return nil, fmt.Errorf("pluginhost: objectstore plugin %q: %w", s.spec.Name, objectstore.ErrClosed)
	}
	inst := s.cur.Load()
	if inst != nil && !inst.proc.exited() {
		return inst, nil // another caller restarted it
	}
	if inst != nil {
		// It died between calls: nobody has noticed yet.
		s.log.Warn().Str("plugin", s.spec.Name).Int("pid", inst.proc.pid).Msg("objectstore plugin exited; restarting it")
		s.cur.CompareAndSwap(inst, nil)
		inst.proc.kill()
		s.failed()
	}
	s.mu.Lock()
	wait := time.Duration(0)
	if s.failures > 0 {
		wait = time.Until(s.lastFailure.Add(s.opts.backoff(s.failures)))
	}
	s.mu.Unlock()
	if err := sleepCtx(ctx, wait); err != nil {
		return nil, err
	}
	inst, err := s.start(ctx)
	if err != nil {
		s.failed()
		return nil, fmt.Errorf("pluginhost: restarting objectstore plugin %q: %w", s.spec.Name, err)
	}
	s.restarts.Add(1)
	s.log.Info().Str("plugin", s.spec.Name).Int("pid", inst.proc.pid).Int64("restarts", s.restarts.Load()).Msg("objectstore plugin restarted")
	s.cur.Store(inst)
	return inst, nil
}

// failed records a crash or a failed start, for the backoff.
func (s *ObjectStore) failed() {
	s.mu.Lock()
	s.failures++
	s.lastFailure = time.Now()
	s.anyFailures.Store(true)
	s.mu.Unlock()
}

// check inspects the error of a call made on inst. When the plugin process
// is gone (or no longer answers), it retires inst, so that the next call
// restarts the plugin, and returns an error that says so.
func (s *ObjectStore) check(inst *osInstance, err error) error {
	if err == nil {
		if s.anyFailures.Load() {
			s.mu.Lock()
			s.failures = 0
			s.anyFailures.Store(false)
			s.mu.Unlock()
		}
		return nil
	}
	if status.Code(err) != codes.Unavailable && !inst.proc.exited() {
		return err
	}
	if inst.proc.alive() {
		return err // the backend's own transient failure
	}
	exited := inst.proc.waitExit(time.Second)
	if s.cur.CompareAndSwap(inst, nil) {
		s.log.Error().Str("plugin", s.spec.Name).Int("pid", inst.proc.pid).Err(err).Bool("exited", exited).
			Msg("objectstore plugin died; it restarts on the next call")
		go inst.proc.kill()
		s.failed()
	}
	verb := "exited"
	if !exited {
		verb = "stopped answering"
	}
	return objectstore.Transient(fmt.Errorf("objectstore plugin %q (pid %d) %s: %w", s.spec.Name, inst.proc.pid, verb, err))
}

// Put stores r under key in the plugin's store.
func (s *ObjectStore) Put(ctx context.Context, key string, r io.Reader, opts objectstore.PutOptions) error {
	inst, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	return s.check(inst, inst.store.Put(ctx, key, r, opts))
}

// Get returns a reader that streams the object from the plugin.
func (s *ObjectStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	inst, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	rc, err := inst.store.Get(ctx, key)
	if err != nil {
		return nil, s.check(inst, err)
	}
	return &hostReader{rc: rc, s: s, inst: inst}, nil
}

// GetRange returns a reader that streams a range of the object.
func (s *ObjectStore) GetRange(ctx context.Context, key string, off, length int64) (io.ReadCloser, error) {
	inst, err := s.acquire(ctx)
	if err != nil {
		return nil, err
	}
	rc, err := inst.store.GetRange(ctx, key, off, length)
	if err != nil {
		return nil, s.check(inst, err)
	}
	return &hostReader{rc: rc, s: s, inst: inst}, nil
}

// hostReader turns a stream broken by a dying plugin into a clear error.
type hostReader struct {
	rc   io.ReadCloser
	s    *ObjectStore
	inst *osInstance
}

func (h *hostReader) Read(p []byte) (int, error) {
	n, err := h.rc.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = h.s.check(h.inst, err)
	}
	return n, err
}

func (h *hostReader) Close() error { return h.rc.Close() }

// Stat returns the object's metadata.
func (s *ObjectStore) Stat(ctx context.Context, key string) (objectstore.ObjectInfo, error) {
	inst, err := s.acquire(ctx)
	if err != nil {
		return objectstore.ObjectInfo{}, err
	}
	oi, err := inst.store.Stat(ctx, key)
	return oi, s.check(inst, err)
}

// List lists the objects under prefix.
func (s *ObjectStore) List(ctx context.Context, prefix string, fn func(objectstore.ObjectInfo) error) error {
	inst, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	var fnErr error
	err = inst.store.List(ctx, prefix, func(oi objectstore.ObjectInfo) error {
		fnErr = fn(oi)
		return fnErr
	})
	if fnErr != nil && errors.Is(err, fnErr) {
		return err // the caller's own error, unchanged
	}
	return s.check(inst, err)
}

// Delete removes the object.
func (s *ObjectStore) Delete(ctx context.Context, key string) error {
	inst, err := s.acquire(ctx)
	if err != nil {
		return err
	}
	return s.check(inst, inst.store.Delete(ctx, key))
}

// Close closes the plugin's store and stops the process. Calls after Close
// fail with objectstore.ErrClosed.
func (s *ObjectStore) Close() error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.sem <- struct{}{} // wait out a restart in progress
	defer func() { <-s.sem }()
	inst := s.cur.Swap(nil)
	if inst == nil {
		return nil
	}
	defer inst.proc.kill()
	if inst.proc.exited() {
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- inst.store.Close() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("pluginhost: closing objectstore plugin %q (pid %d): %w", s.spec.Name, inst.proc.pid, err)
		}
		return nil
	case <-time.After(s.opts.CloseTimeout):
		return fmt.Errorf("pluginhost: closing objectstore plugin %q (pid %d): no answer after %v; killing it",
			s.spec.Name, inst.proc.pid, s.opts.CloseTimeout)
	}
}
