package pluginhost

import (
	"fmt"
	"sort"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
)

// Registry holds the builtin plugins: those linked into the strata binary
// and chosen by name in the config (mode: builtin). A builtin is registered
// with the same factory an external plugin's main passes to
// objectstore.ServePlugin, so every first-party plugin runs both ways.
//
// The binary builds one Registry at startup (no global registry); it is not
// safe to register while another goroutine opens.
type Registry struct {
	objectStores map[string]objectstore.PluginFactory
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{objectStores: map[string]objectstore.PluginFactory{}}
}

// RegisterObjectStore adds a builtin object store under name (the config's
// objectstore.type). Registering a name twice is an error.
func (r *Registry) RegisterObjectStore(name string, f objectstore.PluginFactory) error {
	if name == "" || f == nil {
		return fmt.Errorf("pluginhost: RegisterObjectStore(%q): empty name or nil factory", name)
	}
	if _, dup := r.objectStores[name]; dup {
		return fmt.Errorf("pluginhost: builtin objectstore %q registered twice", name)
	}
	r.objectStores[name] = f
	return nil
}

// ObjectStores lists the builtin object store names, sorted.
func (r *Registry) ObjectStores() []string {
	names := make([]string, 0, len(r.objectStores))
	for n := range r.objectStores {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// OpenObjectStore opens the builtin object store name with its config
// section (JSON). The log gets a plugin=name field, as external plugins'
// lines do.
func (r *Registry) OpenObjectStore(name string, configJSON []byte, log zerolog.Logger) (objectstore.Store, error) {
	f, ok := r.objectStores[name]
	if !ok {
		return nil, fmt.Errorf("pluginhost: no builtin objectstore %q (builtin: %v); use mode: external with a plugin path for others",
			name, r.ObjectStores())
	}
	st, err := f(configJSON, log.With().Str("plugin", name).Logger())
	if err != nil {
		return nil, fmt.Errorf("pluginhost: objectstore %q: %w", name, err)
	}
	return st, nil
}
