package pluginhost

import (
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
)

// Process is one running external plugin, for hosts of contracts that have
// no opener in this package yet. It does not restart itself: its owner
// checks Exited or Alive after a failed call and launches a new one (see
// ObjectStore for the pattern). OpenObjectStore manages its own processes.
type Process struct{ p *process }

// Launch starts spec's binary as a plugin of the given kind (the name
// passed to plugin.ServeConfig.Kind) speaking protocol version, with shim as
// the host side of the contract's go-plugin glue (for example
// &cache.AdvisorGRPCPlugin{}), and dispenses it. It makes the same checks,
// with the same errors, as OpenObjectStore: binary, checksum (ErrChecksum),
// version (ErrVersion), mTLS, and log forwarding. The caller must Kill the
// process.
func Launch(spec Spec, kind string, version int, shim goplugin.Plugin, opts Options, log zerolog.Logger) (*Process, error) {
	p, err := launch(spec, kind, version, shim, opts.withDefaults(), log)
	if err != nil {
		return nil, err
	}
	return &Process{p}, nil
}

// Client is the value the shim's GRPCClient returned (for an object store,
// a *objectstore.GRPCClient).
func (p *Process) Client() any { return p.p.raw }

// PID is the plugin's process id.
func (p *Process) PID() int { return p.p.pid }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool { return p.p.exited() }

// Alive reports whether the plugin answers a health check within 2 seconds.
func (p *Process) Alive() bool { return p.p.alive() }

// Kill stops the process (gracefully, then by force after 2 seconds) and
// waits for it. It may be called more than once.
func (p *Process) Kill() { p.p.kill() }
