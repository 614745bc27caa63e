// Package pluginhost runs strata plugins out of process: it launches a
// plugin binary with hashicorp/go-plugin over gRPC (handshake cookie,
// protocol version negotiation, SHA-256 checksum of the binary, automatic
// mutual TLS), forwards the plugin's log into the host's zerolog logger,
// hands the plugin its config section, and restarts it when it crashes.
//
// Per contract it offers one opener; today OpenObjectStore, an
// objectstore.Store backed by an external plugin process, restarted with
// backoff when it dies. Launch (with the same checksum, version, mTLS and
// log forwarding) knows no contract and serves the next ones (redo,
// replication, cache) until they get an opener of their own.
//
// Choosing builtin or external for a config section is done by core/objstore
// from core/config; this package reads no config files. Plugins never
// import it: they use sdk/plugin and the contract packages.
package pluginhost

import (
	"time"
)

// Spec says how to run one external plugin.
type Spec struct {
	// Name is the plugin's name in the config (for example "fs"). It
	// appears in every log line and error about the plugin (default: the
	// binary's file name).
	Name string
	// Path is the plugin binary.
	Path string
	// Args are passed to the binary.
	Args []string
	// SHA256 is the expected SHA-256 of the binary, in hex. When set, a
	// binary with another checksum is refused before it runs. When empty,
	// the binary runs unchecked and a warning is logged.
	SHA256 string
	// ConfigJSON is the plugin's own config section, as JSON; the plugin
	// receives it at every start (its Configure call).
	ConfigJSON []byte
}

// Options tune the host. The zero value is fine.
type Options struct {
	// StartTimeout bounds how long a plugin may take to start and
	// complete the handshake (default 20s).
	StartTimeout time.Duration
	// RestartBackoff is the pause before restarting a plugin that died
	// (default 100ms). It doubles with each consecutive failure, up to
	// MaxRestartBackoff (default 10s), and resets after a call succeeds.
	RestartBackoff    time.Duration
	MaxRestartBackoff time.Duration
	// CloseTimeout bounds the plugin's Close call at shutdown (default 10s).
	CloseTimeout time.Duration
}

func (o Options) withDefaults() Options {
	if o.StartTimeout <= 0 {
		o.StartTimeout = 20 * time.Second
	}
	if o.RestartBackoff <= 0 {
		o.RestartBackoff = 100 * time.Millisecond
	}
	if o.MaxRestartBackoff <= 0 {
		o.MaxRestartBackoff = 10 * time.Second
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 10 * time.Second
	}
	return o
}

// backoff returns the pause before a restart after failures consecutive
// failures (failures >= 1).
func (o Options) backoff(failures int) time.Duration {
	d := o.RestartBackoff
	for i := 1; i < failures && d < o.MaxRestartBackoff; i++ {
		d *= 2
	}
	return min(d, o.MaxRestartBackoff)
}
