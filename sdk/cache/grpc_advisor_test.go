package cache_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	goplugin "github.com/hashicorp/go-plugin"
	"github.com/rs/zerolog"

	"github.com/stratadb/strata/sdk/cache"
	"github.com/stratadb/strata/sdk/pg"
)

// halving advises half the capacity whenever the previous period had no
// hits, refuses budgets it finds absurd and says it is closed when asked
// about a negative period.
type halving struct{ floor int64 }

func (h halving) Advise(_ context.Context, obs cache.Observation) (cache.Advice, error) {
	if obs.Period < 0 {
		return cache.Advice{}, cache.ErrClosed
	}
	if obs.BudgetBytes > 1<<50 {
		return cache.Advice{}, cache.ErrBadSize
	}
	if obs.Stats.Hits-obs.Prev.Hits > 0 || obs.Stats.CapacityBytes <= h.floor {
		return cache.Advice{}, nil
	}
	return cache.Advice{Resize: true, CapacityBytes: obs.Stats.CapacityBytes / 2}, nil
}

func openAdvisorShim(t *testing.T, configJSON string) *cache.AdvisorGRPCClient {
	t.Helper()
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		cache.AdvisorPluginKind: &cache.AdvisorGRPCPlugin{Log: zerolog.Nop(), Factory: func(cfg []byte, _ zerolog.Logger) (cache.Advisor, error) {
			var c struct {
				Floor int64 `json:"floor"`
			}
			if err := json.Unmarshal(cfg, &c); err != nil {
				return nil, err
			}
			return halving{floor: c.Floor}, nil
		}},
	})
	t.Cleanup(func() { _ = client.Close() })
	raw, err := client.Dispense(cache.AdvisorPluginKind)
	if err != nil {
		t.Fatal(err)
	}
	a, ok := raw.(*cache.AdvisorGRPCClient)
	if !ok {
		t.Fatalf("Dispense returned %T", raw)
	}
	if err := a.Configure(context.Background(), []byte(configJSON)); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return a
}

func TestAdvisorGRPC(t *testing.T) {
	a := openAdvisorShim(t, `{"floor": 8192}`)
	ctx := context.Background()
	obs := cache.Observation{
		Stats:  cache.Stats{Hits: 5, Misses: 9, Puts: 3, StalePuts: 1, Evictions: 2, Invalidations: 4, Pages: 6, UsedBytes: 7, CapacityBytes: 1 << 20},
		Prev:   cache.Stats{Hits: 5},
		Period: time.Second, BudgetBytes: 1 << 30,
		Waits: []cache.WaitStat{{Name: "lfc_lock", Count: 3, Total: time.Millisecond}},
	}
	adv, err := a.Advise(ctx, obs)
	if err != nil || adv != (cache.Advice{Resize: true, CapacityBytes: 1 << 19}) {
		t.Fatalf("Advise = %+v, %v", adv, err)
	}
	obs.Stats.Hits = 6
	if adv, err := a.Advise(ctx, obs); err != nil || adv.Resize {
		t.Fatalf("Advise with hits = %+v, %v", adv, err)
	}
	// Sentinels cross the boundary.
	obs.BudgetBytes = 1 << 60
	if _, err := a.Advise(ctx, obs); !errors.Is(err, cache.ErrBadSize) {
		t.Fatalf("Advise: %v, want ErrBadSize", err)
	}
	closed := obs
	closed.Period = -time.Second
	if _, err := a.Advise(ctx, closed); !errors.Is(err, cache.ErrClosed) {
		t.Fatalf("Advise: %v, want ErrClosed", err)
	}
	// A cancelled context comes back as context.Canceled.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := a.Advise(cctx, obs); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Advise: %v", err)
	}

	// RunAdvisor drives a real cache through the plugin: an idle cache is
	// halved down to the advisor's floor.
	c, _ := cache.NewMemory(16 * pg.BlockSize)
	rctx, rcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer rcancel()
	err = cache.RunAdvisor(rctx, c, a, cache.AdvisorOptions{Every: 5 * time.Millisecond, BudgetBytes: 1 << 30})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("RunAdvisor: %v", err)
	}
	if got := c.Stats().CapacityBytes; got != pg.BlockSize {
		t.Fatalf("capacity %d, want the 1-page floor", got)
	}
}

func TestAdvisorGRPCBadConfig(t *testing.T) {
	client, _ := goplugin.TestPluginGRPCConn(t, false, map[string]goplugin.Plugin{
		cache.AdvisorPluginKind: &cache.AdvisorGRPCPlugin{Factory: func([]byte, zerolog.Logger) (cache.Advisor, error) {
			return nil, errors.New("floor must be set")
		}},
	})
	defer client.Close()
	raw, err := client.Dispense(cache.AdvisorPluginKind)
	if err != nil {
		t.Fatal(err)
	}
	a := raw.(*cache.AdvisorGRPCClient)
	if _, err := a.Advise(context.Background(), cache.Observation{}); err == nil {
		t.Fatal("Advise before Configure succeeded")
	}
	if err := a.Configure(context.Background(), nil); err == nil || !strings.Contains(err.Error(), "floor must be set") {
		t.Fatalf("Configure: %v", err)
	}
}
