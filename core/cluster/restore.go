package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/stratadb/strata/core/compute/agent"
	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/core/pageserver/client"
	"github.com/stratadb/strata/core/postgres"
	"github.com/stratadb/strata/core/restore"
	"github.com/stratadb/strata/sdk/pg"
)

// Restored is what Restore made: the result, and how to run it.
type Restored struct {
	*restore.Result
	Dir  string
	Port int
	// URL connects to the restored server once it is started (the
	// cluster's superuser password: the copy keeps its roles).
	URL string
	// Start is the command that starts it.
	Start string
	// PasswordLost, when set, says how to connect without the password
	// (the cluster's folder that held it is gone).
	PasswordLost string
}

// Restore writes a stock PostgreSQL data directory holding the cluster's
// database as it was at `at` into dir (package restore), reading the
// pages from the running cluster's pageserver and the WAL from its
// safekeepers and the object store's archive. The restored server is
// configured for port (0: a free one) and left stopped.
func (c *Cluster) Restore(ctx context.Context, at restore.Target, dir string, port int, progress func(string)) (*Restored, error) {
	return c.restore(ctx, at, dir, port, progress, nil)
}

// restore is Restore; adjust, when set, changes the options first (a test
// takes the WAL from the archive alone).
func (c *Cluster) restore(ctx context.Context, at restore.Target, dir string, port int, progress func(string), adjust func(*restore.Options)) (*Restored, error) {
	st, ok := c.Running()
	if !ok {
		return nil, fmt.Errorf("restore: the cluster in %s is not running: a restore reads pages from its pageserver and WAL from its safekeepers; start it with `strata up`, or restore from the object store alone with --from-store", c.absDataDir())
	}
	tl, err := pg.ParseTimelineID(st.Timeline)
	if err != nil {
		return nil, fmt.Errorf("restore: %s: %w", c.statePath(), err)
	}
	var filesTL pg.TimelineID
	if st.FilesTimeline != "" {
		if filesTL, err = pg.ParseTimelineID(st.FilesTimeline); err != nil {
			return nil, fmt.Errorf("restore: %s: %w", c.statePath(), err)
		}
	}
	abs, port, err := c.restoreDest(dir, port)
	if err != nil {
		return nil, err
	}
	ps, err := client.Dial(st.Pageserver)
	if err != nil {
		return nil, fmt.Errorf("restore: pageserver %s: %w", st.Pageserver, err)
	}
	defer ps.Close()
	store, err := objstore.Open(ctx, c.cfg.ObjectStore, c.log, nil)
	if err != nil {
		return nil, err
	}
	defer store.Close()
	o := restore.Options{
		Pageserver: ps, Timeline: tl, FilesTimeline: filesTL, Redo: st.PageSource == "redo",
		WAL:      agent.WALSource{Safekeepers: c.safekeeperAddrs(), Archive: store, Prefix: "wal"},
		Postgres: postgres.Server{BinDir: c.cfg.Compute.PGBinDir, OSUser: c.cfg.Compute.OSUser},
		Dir:      abs, Port: port, At: at, Progress: progress, Log: c.log,
		// A pageserver that stops answering is waited for while its
		// supervisor restarts it, not after `strata down`.
		Stopped: func() error {
			if _, ok := c.Running(); !ok {
				return errors.New("the cluster was stopped while the restore read: start it with strata up and restore again")
			}
			return nil
		},
	}
	if adjust != nil {
		adjust(&o)
	}
	res, err := restore.Run(ctx, o)
	if err != nil {
		return nil, err
	}
	return c.restored(res, abs, port), nil
}

// restored says how to start and reach a restored copy. The password is
// the cluster's when its folder still holds it.
func (c *Cluster) restored(res *restore.Result, dir string, port int) *Restored {
	srv := postgres.Server{BinDir: c.cfg.Compute.PGBinDir, DataDir: dir, Port: port}
	start := fmt.Sprintf("pg_ctl -D %s -l %s start", dir, filepath.Join(dir, "postgres.log"))
	if bin := c.cfg.Compute.PGBinDir; bin != "" {
		start = filepath.Join(bin, start)
	} else {
		start = filepath.Join(postgres.DefaultBinDir, start)
	}
	user := c.cfg.Compute.OSUser
	if user == "" {
		user = "postgres"
	}
	if cred, _ := srv.Credential(); cred != nil {
		start = fmt.Sprintf("runuser -u %s -- %s", user, start)
	}
	pw := "PASSWORD"
	if b, err := os.ReadFile(filepath.Join(c.dataDir, "secrets", "postgres.password")); err == nil {
		pw = strings.TrimSpace(string(b))
	}
	r := &Restored{Result: res, Dir: dir, Port: port, URL: srv.URL(pw, "postgres"), Start: start}
	if pw == "PASSWORD" {
		r.PasswordLost = fmt.Sprintf("the superuser's password was in %s, which is gone: connect as the %s OS user over the Unix socket in %s (trusted), e.g. `runuser -u %s -- psql -h %s -p %d postgres`, and set a new one with ALTER ROLE", filepath.Join(c.dataDir, "secrets"), user, dir, user, dir, port)
	}
	return r
}

// restoreDest checks a restore's folder (absolute, outside the cluster's)
// and picks a free port when port is 0.
func (c *Cluster) restoreDest(dir string, port int) (string, int, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", 0, err
	}
	if inside(abs, c.absDataDir()) {
		return "", 0, fmt.Errorf("restore: %s is inside the cluster's folder %s: give a folder outside it", abs, c.absDataDir())
	}
	if port == 0 {
		if port, err = freePort(); err != nil {
			return "", 0, err
		}
	}
	return abs, port, nil
}

// inside reports whether p is dir or lies under it.
func inside(p, dir string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != ".." && !filepath.IsAbs(rel) && (rel == "." || !startsWithParent(rel))
}

func startsWithParent(rel string) bool {
	return len(rel) >= 3 && rel[:3] == ".."+string(filepath.Separator)
}

// freePort returns a TCP port on 127.0.0.1 that was free when picked.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, errors.New("restore: no free port on 127.0.0.1: " + err.Error())
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
