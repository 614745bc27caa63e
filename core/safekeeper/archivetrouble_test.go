package safekeeper

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stratadb/strata/core/safekeeper/internal/testpg"
	"github.com/stratadb/strata/core/safekeeper/server"
	"github.com/stratadb/strata/sdk/objectstore/faulty"
)

// TestArchiveTroubleInStatus: while a safekeeper cannot archive, its
// status (over gRPC, what `strata status` prints) says since when, how
// many steps in a row and why; the first step that succeeds clears it.
func TestArchiveTroubleInStatus(t *testing.T) {
	c := startCluster(t)
	waitSync(t, c.srv, 3)
	// Every member archives to the store that is down: each uploads the
	// segments it owns.
	store := faulty.New(c.mem, faulty.Config{})
	store.Add(faulty.Rule{Ops: faulty.OpPut, Err: errors.New("the store is down")})
	for i := range c.nodes {
		c.stopNode(i)
		n, err := New(c.cfgs[i], Deps{Logger: testLogger(t), Archive: store})
		if err != nil {
			t.Fatal(err)
		}
		c.run(i, n)
	}
	waitSync(t, c.srv, 3)
	before := time.Now()
	c.srv.Exec("postgres", "CREATE TABLE x AS SELECT g FROM generate_series(1, 1000) g")
	c.srv.Exec("postgres", "SELECT pg_switch_wal()")
	c.srv.Exec("postgres", "INSERT INTO x VALUES (1)")
	var cls []*server.Client
	for _, cfg := range c.cfgs {
		cl, err := server.Dial(cfg.ListenAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		cls = append(cls, cl)
	}
	ctx := context.Background()
	// failing returns the status of a member whose archive steps failed
	// at least twice in a row (the owner of the segment due), and whether
	// every member is clear.
	failing := func() (server.Status, bool) {
		clear := true
		for _, cl := range cls {
			st, err := cl.Status(ctx)
			if err != nil {
				return server.Status{}, false
			}
			if st.Archive.Failures >= 2 {
				return st, false
			}
			clear = clear && st.Archive.Failures == 0 && st.Archive.Err == ""
		}
		return server.Status{}, clear
	}
	var st server.Status
	testpg.WaitFor(t, 30*time.Second, "archive failures in a member's status", func() bool {
		c.srv.Exec("postgres", "INSERT INTO x VALUES (1)") // moves the commit LSN
		st, _ = failing()
		return st.ID != ""
	})
	if a := st.Archive; !strings.Contains(a.Err, "the store is down") || a.Since.Before(before.Add(-time.Second)) || a.Since.After(time.Now()) {
		t.Fatalf("%s's archive trouble: %+v", st.ID, a)
	}
	store.Reset() // the store is back
	testpg.WaitFor(t, 30*time.Second, "archive trouble cleared on every member", func() bool {
		_, clear := failing()
		return clear
	})
}
