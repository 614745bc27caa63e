package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pageserver/manifest"
	"github.com/stratadb/strata/core/safekeeper/walstore"
	"github.com/stratadb/strata/internal/brief"
	"github.com/stratadb/strata/sdk/pg"
)

// group is a safekeeper group: its size and its quorum.
type group struct{ size, quorum int }

func (g group) String() string { return fmt.Sprintf("%d (quorum %d)", g.size, g.quorum) }

// groupFile keeps the group the cluster last ran with.
func (c *Cluster) groupFile() string { return filepath.Join(c.dataDir, "safekeeper_group") }

func (c *Cluster) configGroup() group {
	return group{c.cfg.Cluster.Safekeepers, c.cfg.Cluster.Quorum}
}

// lastGroup returns the group the cluster last ran with: the one recorded
// in groupFile, or, for a cluster from before that file, as many members as
// safekeeper folders, with the configured quorum when that is the
// configured size (the quorum is not on disk) and a majority otherwise.
// ok is false for a new cluster.
func (c *Cluster) lastGroup() (g group, ok bool, err error) {
	b, err := os.ReadFile(c.groupFile())
	if err == nil {
		if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d %d", &g.size, &g.quorum); err != nil || g.size < 1 || g.quorum < 1 {
			return g, false, fmt.Errorf("cluster: %s: want \"<safekeepers> <quorum>\", got %q", c.groupFile(), strings.TrimSpace(string(b)))
		}
		return g, true, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return g, false, err
	}
	for i := 1; ; i++ {
		if _, err := os.Stat(filepath.Join(c.memberDir(i), walstore.ControlFileName)); err != nil {
			break
		}
		g.size = i
	}
	if g.size == 0 {
		return g, false, nil
	}
	if g.size == c.cfg.Cluster.Safekeepers {
		return c.configGroup(), true, nil
	}
	return group{g.size, g.size/2 + 1}, true, nil
}

// memberDir is the folder of safekeeper number i (1-based).
func (c *Cluster) memberDir(i int) string {
	return filepath.Join(c.dataDir, "safekeepers", fmt.Sprintf("sk%d", i))
}

func (c *Cluster) saveGroup() error {
	g := c.configGroup()
	tmp := c.groupFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d %d\n", g.size, g.quorum)), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, c.groupFile())
}

// memberWAL is what a safekeeper's folder holds: the term of its last WAL
// and the end of its durable WAL.
type memberWAL struct {
	lastTerm uint64
	flush    pg.LSN
}

func (w memberWAL) less(o memberWAL) bool {
	return w.lastTerm < o.lastTerm || (w.lastTerm == o.lastTerm && w.flush < o.flush)
}

// readMemberWAL opens the stopped safekeeper's WAL store in dir (as the
// safekeeper does at its start) and returns its last term and flush LSN;
// a folder without a control file is an empty member.
func readMemberWAL(dir string) (memberWAL, error) {
	if _, err := os.Stat(filepath.Join(dir, walstore.ControlFileName)); errors.Is(err, os.ErrNotExist) {
		return memberWAL{}, nil
	}
	st, err := walstore.Open(walstore.Options{Dir: dir, Logger: zerolog.Nop()})
	if err != nil {
		return memberWAL{}, err
	}
	defer st.Close()
	ctl := st.Control()
	return memberWAL{lastTerm: ctl.LastTerm(), flush: st.FlushLSN()}, nil
}

// checkGroupChange refuses a change of the safekeeper group that could
// lose acknowledged commits. A commit was acknowledged by a quorum of the
// old group; the first election in the new group takes the newest WAL
// among the members that vote, and a quorum of the new group may vote.
// The change is safe when every quorum of the new group holds a member
// with all the WAL there is (the newest last term and, in it, the highest
// flush LSN of every folder): fewer than a quorum of the new group may lack
// it. After a clean `strata down` with every safekeeper up, every member
// holds all of it and any change passes; a member that was down or behind
// (or the new, empty ones, when they are a quorum on their own) makes it
// fail, with what to do. It returns a line for the operator when the group
// changes, "" when it does not.
func (c *Cluster) checkGroupChange() (string, error) {
	old, ok, err := c.lastGroup()
	if err != nil || !ok {
		return "", err
	}
	cur := c.configGroup()
	if old == cur {
		return "", nil
	}
	n := max(old.size, cur.size)
	wal := make([]memberWAL, n+1)
	var newest memberWAL
	for i := 1; i <= n; i++ {
		if wal[i], err = readMemberWAL(c.memberDir(i)); err != nil {
			return "", fmt.Errorf("cluster: the safekeeper group changes from %s to %s; reading sk%d's WAL to check that no commit is lost: %w", old, cur, i, err)
		}
		if newest.less(wal[i]) {
			newest = wal[i]
		}
	}
	var complete, lacking []string
	for i := 1; i <= cur.size; i++ {
		if wal[i] == newest {
			complete = append(complete, fmt.Sprintf("sk%d", i))
		} else {
			lacking = append(lacking, fmt.Sprintf("sk%d (%s)", i, wal[i].flush))
		}
	}
	if len(lacking) >= cur.quorum {
		have := "no member of the new group holds it"
		if len(complete) > 0 {
			have = "only " + strings.Join(complete, ", ") + " of the new group hold it"
		}
		return "", fmt.Errorf("cluster: changing the safekeeper group from %s to %s could lose acknowledged commits: the WAL goes up to %s (term %d), %s, and %d of the new group lack it (%s), enough to elect without it. Start the cluster with its old group (cluster.safekeepers: %d, cluster.quorum: %d), let every safekeeper catch up (the same flush LSN on each in `strata status`), stop it with `strata down`, then change the group",
			old, cur, newest.flush, newest.lastTerm, have, len(lacking), strings.Join(lacking, ", "), old.size, old.quorum)
	}
	return fmt.Sprintf("the safekeeper group changes from %s to %s: %s hold all the WAL (up to %s)", old, cur, strings.Join(complete, ", "), newest.flush), nil
}

// checkStore lists the timelines in the object store before anything
// starts. A store that cannot be used (a bucket that does not exist,
// credentials it refuses, an endpoint that does not answer) fails `strata
// up` here, in the store's own words, and not after the safekeepers have
// started, in the pageserver's log.
//
// A cluster that has run before starts anyway when the store only fails
// to answer (a transient failure, or no answer within 10 s): its
// pageserver serves the timeline from its own disk meanwhile. The
// returned line says so.
//
// For a new cluster (fresh) it also returns a line for the operator when
// the store already holds other clusters' timelines: a cluster whose data
// folder was lost cannot be started again from them (its safekeepers' WAL
// and its secrets were in that folder), and an operator who expected
// `strata up` to find it should hear so before new data goes into a new,
// empty cluster.
func (c *Cluster) checkStore(ctx context.Context, fresh bool) (string, error) {
	wait := 30 * time.Second
	if !fresh {
		wait = 10 * time.Second // the pageserver asks again as it starts
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	st, err := objstore.Open(ctx, c.cfg.ObjectStore, zerolog.Nop(), nil)
	if err != nil {
		return "", fmt.Errorf("cluster: opening the %s object store, before starting anything: %w", c.cfg.ObjectStore.Type, err)
	}
	defer st.Close()
	tls, err := (&manifest.Remote{Store: st}).Timelines(ctx)
	if err != nil && !fresh && manifest.Unanswered(err) {
		// A restart during an outage: the pageserver serves the
		// timeline from its disk and uploads once the store is back.
		return fmt.Sprintf("the %s object store does not answer (%v): starting on this machine's data; uploads and the WAL archive wait for the store, and `strata status` shows them failing until it is back",
			c.cfg.ObjectStore.Type, err), nil
	}
	if err != nil {
		return "", fmt.Errorf("cluster: the %s object store cannot be listed, so nothing was started: %w", c.cfg.ObjectStore.Type, err)
	}
	if !fresh || len(tls) == 0 {
		return "", nil
	}
	var ids []string
	for _, tl := range tls {
		ids = append(ids, tl.String())
	}
	return fmt.Sprintf("the object store already holds %d timeline(s) of other clusters (%s): this new cluster makes its own; a cluster whose data folder was lost cannot be started from the object store alone (docs/operator.md)",
		len(ids), brief.Join(ids, 3)), nil
}
