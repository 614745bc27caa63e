package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/internal/pgtest"
)

// TestElectWaitsForLateSafekeeper: a safekeeper that answers shortly after
// a quorum of the others (just started, as at `strata up`) still takes
// part in the election, so synchronous_standby_names lists it; one that
// stays away is left out once the grace has passed.
func TestElectWaitsForLateSafekeeper(t *testing.T) {
	for _, tc := range []struct {
		name  string
		late  time.Duration // when sk3 starts; 0: never
		want  []string
		least time.Duration // the election takes at least this long
	}{
		{"late", electGrace / 3, []string{"sk1", "sk2", "sk3"}, electGrace / 3},
		{"away", 0, []string{"sk1", "sk2"}, electGrace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			addrs := []string{pgtest.FreeAddr(t), pgtest.FreeAddr(t), pgtest.FreeAddr(t)}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() { cancel(); wg.Wait() })
			start := func(i int) {
				c := safekeeper.DefaultConfig()
				c.ID = fmt.Sprintf("sk%d", i+1)
				c.DataDir = filepath.Join(dir, c.ID)
				c.ListenAddr = addrs[i]
				c.Postgres = "postgres://nobody@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=1"
				n, err := safekeeper.New(c, safekeeper.Deps{Logger: zerolog.Nop()})
				if err != nil {
					t.Error(err)
					return
				}
				if err := n.Listen(); err != nil {
					t.Error(err)
					return
				}
				wg.Add(1)
				go func() { defer wg.Done(); n.Run(ctx) }()
			}
			start(0)
			start(1)
			if tc.late > 0 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					time.Sleep(tc.late)
					start(2)
				}()
			}
			a := &Agent{cfg: Config{Safekeepers: addrs, Quorum: 2, ComputeID: "c1", Port: 1}, log: zerolog.Nop()}
			ectx, ecancel := context.WithTimeout(ctx, time.Minute)
			defer ecancel()
			t0 := time.Now()
			term, ids, _, err := a.elect(ectx)
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(ids)
			if !slices.Equal(ids, tc.want) || term != 1 {
				t.Fatalf("elected term %d with %v, want term 1 with %v", term, ids, tc.want)
			}
			if took := time.Since(t0); took < tc.least {
				t.Fatalf("elected after %v, want at least %v", took, tc.least)
			}
		})
	}
}
