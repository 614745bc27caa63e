package fs

import (
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/objectstore"
	"github.com/stratadb/strata/sdk/objectstore/storetest"
)

func open(t testing.TB, cfg Config) *Store {
	t.Helper()
	if cfg.Root == "" {
		cfg.Root = t.TempDir()
	}
	s, err := New(cfg, zerolog.Nop())
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return s
}

func TestAcceptance(t *testing.T) {
	storetest.RunOptions(t, func(t *testing.T) objectstore.Store {
		return open(t, Config{})
	}, storetest.Options{StrictClose: true, BigHeapLimit: 64 << 20})
}
