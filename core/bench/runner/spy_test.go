package runner

import (
	"context"
	"sync"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/bench/target"
)

// spyRegistry wraps the default registry to remember the PIDs of the
// targets it made once they start.
type spyRegistry struct {
	target.Registry
	mu   sync.Mutex
	pids []int
	t    target.Target
}

type spyTarget struct {
	target.Target
	s *spyRegistry
}

func (s spyTarget) Start(ctx context.Context) error {
	err := s.Target.Start(ctx)
	s.s.mu.Lock()
	s.s.pids = append(s.s.pids, s.Target.PIDs()...)
	s.s.t = s.Target
	s.s.mu.Unlock()
	return err
}

func (s spyTarget) WALDir() string { return s.Target.(target.WALSource).WALDir() }
func (s spyTarget) BinDir() string { return s.Target.(target.WALSource).BinDir() }

func newSpyRegistry() *spyRegistry {
	s := &spyRegistry{Registry: target.Registry{}}
	for k, f := range target.DefaultRegistry() {
		s.Registry[k] = func(c target.Config, l zerolog.Logger) (target.Target, error) {
			t, err := f(c, l)
			if err != nil {
				return nil, err
			}
			return spyTarget{Target: t, s: s}, nil
		}
	}
	return s
}

func (s *spyRegistry) started() target.Target {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.t
}
