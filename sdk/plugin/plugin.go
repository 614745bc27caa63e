// Package plugin holds what every strata plugin contract shares when it runs
// out of process: the go-plugin handshake, the Serve helper a plugin's main
// calls, the mapping of a contract's sentinel errors to gRPC status codes and
// back, and the logger a plugin writes with so that the host can forward its
// lines into the host's own log.
//
// It knows no contract. Each contract package (sdk/objectstore, and later
// redo, replication, cache) builds its gRPC shim on top of it and offers a
// one-line serve function, such as objectstore.ServePlugin. The host side
// (launching, checksums, restarts) is core/pluginhost.
//
// It is not a general RPC layer: hot paths (per-page cache calls) must stay in
// process (docs/plugins.md, "Cost": a call across the boundary costs a few
// hundred microseconds).
package plugin

import (
	"os"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"
)

// Handshake is the go-plugin handshake every strata plugin and host share.
// The cookie only tells a binary that strata started it (so that running a
// plugin by hand prints a hint instead of hanging); it is not a security
// measure: the checksum and mTLS are. The ProtocolVersion field is unused:
// each contract negotiates its own version through VersionedPlugins.
var Handshake = goplugin.HandshakeConfig{
	MagicCookieKey:   "STRATA_PLUGIN_MAGIC_COOKIE",
	MagicCookieValue: "5f1c3e0a8b7d4d2e9a61c0b4f2e7d9a3-strata",
}

// ServeConfig says what a plugin binary serves.
type ServeConfig struct {
	// Kind is the contract's plugin name, e.g. "objectstore". The host
	// dispenses the plugin by this name.
	Kind string
	// Version is the contract's protocol version this binary speaks. A host
	// that does not support it refuses the plugin with a clear error.
	Version int
	// Plugin is the contract's go-plugin shim (a goplugin.GRPCPlugin).
	Plugin goplugin.Plugin
}

// Serve runs the plugin until the host stops it, then exits the process.
// Call it from main. Log lines the plugin writes with NewLogger(os.Stderr)
// reach the host's log; anything else written to stdout or stderr after
// Serve starts is forwarded too, as plain lines.
func Serve(cfg ServeConfig) {
	goplugin.Serve(&goplugin.ServeConfig{
		HandshakeConfig:  Handshake,
		VersionedPlugins: map[int]goplugin.PluginSet{cfg.Version: {cfg.Kind: cfg.Plugin}},
		GRPCServer:       goplugin.DefaultGRPCServer,
		Logger: hclog.New(&hclog.LoggerOptions{
			Name:       "go-plugin",
			Level:      hclog.Info,
			Output:     os.Stderr,
			JSONFormat: true,
		}),
	})
}

// Logger returns the zerolog logger a plugin should log with: its lines go to
// the real standard error (captured now, before go-plugin redirects
// os.Stderr) in the JSON shape go-plugin parses, so the host logs them at the
// same level with the same fields, under the plugin's name.
func Logger() zerolog.Logger {
	return NewLogger(os.Stderr)
}
