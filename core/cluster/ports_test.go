package cluster

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/internal/netport"
)

// TestEphemeralPortsWarned: strata up warns of each key whose port lies
// in the kernel's ephemeral range, and of no other; the defaults are
// below it.
func TestEphemeralPortsWarned(t *testing.T) {
	lo, _ := netport.EphemeralRange()
	cfg := config.Default()
	c, err := New(&cfg, "strata", zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if w := c.ephemeralPorts(); len(w) != 0 {
		t.Fatalf("the default ports are in the ephemeral range: %q", w)
	}
	cfg.Compute.Port = lo + 1000
	cfg.Cluster.MetricsPort = lo + 2000
	w := c.ephemeralPorts()
	if len(w) != 2 || !strings.Contains(w[0], "compute.port") || !strings.Contains(w[1], "cluster.metrics_port") {
		t.Fatalf("warnings %q, want one for compute.port and one for cluster.metrics_port", w)
	}
	cfg.Cluster.MetricsPort = 0 // metrics off: no port
	if w := c.ephemeralPorts(); len(w) != 1 {
		t.Fatalf("warnings with metrics off: %q", w)
	}
}
