package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// redoGuardName names the event trigger (and its function in pg_catalog)
// that refuses, in redo mode, indexes whose WAL the Go redo engine does not
// replay.
const redoGuardName = "strata_redo_index_guard"

// redoIndexAMs are the index access methods whose WAL the Go redo engine
// replays, as an SQL list (plugins/redo/postgres): Postgres' own, and the
// extensions' methods known to log through generic WAL (contrib's bloom,
// pgvector's hnsw and ivfflat). Another extension's method may log
// records of its own resource manager, which the engine cannot replay.
const redoIndexAMs = "'btree', 'hash', 'gist', 'spgist', 'gin', 'brin', 'bloom', 'hnsw', 'ivfflat'"

// redoGuardBody is the guard function's body. At the end of every DDL
// command it looks
// at the indexes the command made: the ones it reports itself (CREATE
// INDEX, a CREATE TABLE's constraints) and the new indexes of a table it
// reports (ALTER TABLE ... ADD CONSTRAINT ... EXCLUDE); one of a method not
// in redoIndexAMs (an extension's with WAL of its own) and not temporary
// (no WAL) fails the command.
const redoGuardBody = `
DECLARE r record;
BEGIN
  FOR r IN SELECT c.oid::regclass AS idx, am.amname
           FROM pg_event_trigger_ddl_commands() d
           JOIN pg_class c ON c.oid = d.objid
             OR (c.xmin = pg_current_xact_id()::xid AND c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = d.objid))
           JOIN pg_am am ON am.oid = c.relam
           WHERE d.classid = 'pg_class'::regclass AND c.relkind IN ('i', 'I')
             AND c.relpersistence <> 't' AND am.amname NOT IN (` + redoIndexAMs + `)
  LOOP
    RAISE EXCEPTION 'strata redo mode cannot rebuild the pages of % indexes from WAL: index % refused', r.amname, r.idx
      USING HINT = 'Use an index method whose WAL strata replays (btree, hash, gist, spgist, gin, brin, bloom, hnsw, ivfflat), or run the cluster with storage.page_source: writeback. An index built CONCURRENTLY stays behind, invalid: DROP INDEX it.';
  END LOOP;
END `

// redoGuardFunc creates or updates the guard function. It lives in
// pg_catalog so that pg_dump leaves it out.
const redoGuardFunc = `CREATE OR REPLACE FUNCTION pg_catalog.` + redoGuardName + `() RETURNS event_trigger
LANGUAGE plpgsql AS $guard$` + redoGuardBody + `$guard$;`

// redoGuardTrigger creates the event trigger.
const redoGuardTrigger = `CREATE EVENT TRIGGER ` + redoGuardName + ` ON ddl_command_end EXECUTE FUNCTION pg_catalog.` + redoGuardName + `();`

// redoGuardEvery is how often the agent looks for databases created since
// its last look (one made from template0 has no guard).
const redoGuardEvery = 10 * time.Second

// redoGuardSoon is how often the agent looks for a database whose folder
// Postgres has just made, until the CREATE DATABASE commits (and the guard
// is seen to) or for redoGuardSoonFor (one that failed never shows).
const (
	redoGuardSoon    = 200 * time.Millisecond
	redoGuardSoonFor = time.Minute
)

// redoGuarded remembers, by database OID, the databases the agent saw to
// (the guard installed or there) and those it failed to (logged once).
type redoGuarded struct {
	mu     sync.Mutex
	done   map[uint32]bool
	failed map[uint32]bool
}

func (g *redoGuarded) seen(oid uint32) (done, failed bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.done[oid], g.failed[oid]
}

func (g *redoGuarded) mark(oid uint32, ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done == nil {
		g.done, g.failed = map[uint32]bool{}, map[uint32]bool{}
	}
	if ok {
		g.done[oid] = true
	} else {
		g.failed[oid] = true
	}
}

// ensureRedoGuard installs the index guard in every database that accepts
// connections and has none (template1's copy reaches the databases created
// from it later; one created from template0 gets it from watchRedoGuard
// as soon as it accepts connections). A guard an operator disabled (ALTER EVENT
// TRIGGER ... DISABLE) stays disabled. Indexes of other types already there
// are logged: their pages cannot be read back from the pageserver once the
// compute evicts them. A database the agent cannot reach is logged (once)
// and skipped: the guard is a safety net, not a reason to keep Postgres
// from serving. With onlyNew, databases already seen to since the agent
// started are left alone.
func (a *Agent) ensureRedoGuard(ctx context.Context, onlyNew bool) {
	conn, err := pgx.Connect(ctx, a.socketConn())
	if err != nil {
		if !onlyNew {
			a.log.Warn().Err(err).Msg("redo index guard: listing the databases")
		}
		return
	}
	type db struct {
		oid  uint32
		name string
	}
	rows, err := conn.Query(ctx, "SELECT oid, datname FROM pg_database WHERE datallowconn ORDER BY datname")
	var dbs []db
	if err == nil {
		dbs, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (d db, err error) {
			err = r.Scan(&d.oid, &d.name)
			return d, err
		})
	}
	conn.Close(ctx)
	if err != nil {
		if !onlyNew {
			a.log.Warn().Err(err).Msg("redo index guard: listing the databases")
		}
		return
	}
	g := &a.guarded
	for _, d := range dbs {
		done, failed := g.seen(d.oid)
		if onlyNew && done {
			continue
		}
		installed, unsupported, err := a.redoGuardDB(ctx, d.name)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if !failed {
				a.log.Warn().Err(err).Str("database", d.name).Dur("retry_every", redoGuardEvery).Msg("redo index guard not installed (tried again, not logged again)")
			}
			g.mark(d.oid, false)
			continue
		}
		g.mark(d.oid, true)
		if installed {
			a.log.Info().Str("database", d.name).Msg("redo index guard installed: CREATE INDEX of a method whose WAL strata does not replay fails")
		}
		if len(unsupported) > 0 {
			a.log.Warn().Str("database", d.name).Strs("indexes", unsupported).
				Msg("indexes the redo engine cannot rebuild from WAL: reading their pages from the pageserver fails; drop them or run in writeback mode")
		}
	}
}

// watchRedoGuard installs the guard in databases created while Postgres
// runs, until ctx ends: at once when the mount reports a new database
// folder (onDatabaseDir), and every redoGuardEvery for any it missed.
func (a *Agent) watchRedoGuard(ctx context.Context) {
	t := time.NewTicker(redoGuardEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.ensureRedoGuard(ctx, true)
		case oid := <-a.guardKick:
			a.guardNewDatabase(ctx, oid)
		}
	}
}

// onDatabaseDir hears of a database folder Postgres made (the mount's
// fusefs.Options.OnDatabaseDir). It does not block: with the queue full,
// the periodic look finds the database.
func (a *Agent) onDatabaseDir(oid uint32) {
	select {
	case a.guardKick <- oid:
	default:
	}
}

// guardNewDatabase looks for database oid, whose folder Postgres has just
// made, every redoGuardSoon until it is committed and the guard seen to,
// so that a database made from template0 (no guard of its own) gets one
// as soon as it accepts connections.
func (a *Agent) guardNewDatabase(ctx context.Context, oid uint32) {
	deadline := time.Now().Add(redoGuardSoonFor)
	for {
		a.ensureRedoGuard(ctx, true)
		if done, _ := a.guarded.seen(oid); done || time.Now().After(deadline) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(redoGuardSoon):
		}
	}
}

// redoGuardDB installs the guard in database db unless it has one (a
// function from an older strata is brought up to date, the trigger and
// whether it is enabled left alone), and lists the database's
// non-temporary indexes of methods not in redoIndexAMs.
func (a *Agent) redoGuardDB(ctx context.Context, db string) (installed bool, unsupported []string, err error) {
	conn, err := pgx.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=%s sslmode=disable",
		filepath.Join(a.cfg.Scratch, "sock"), a.cfg.Port, connValue(db)))
	if err != nil {
		return false, nil, err
	}
	defer conn.Close(ctx)
	// No safekeeper streams yet: commit locally (as ensureReplUser).
	if _, err := conn.Exec(ctx, "SET synchronous_commit = local"); err != nil {
		return false, nil, err
	}
	var exists bool
	var body *string
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = $1),
		(SELECT prosrc FROM pg_proc WHERE proname = $1 AND pronamespace = 'pg_catalog'::regnamespace)`, redoGuardName).Scan(&exists, &body); err != nil {
		return false, nil, err
	}
	switch {
	case !exists:
		if _, err := conn.Exec(ctx, "BEGIN; "+redoGuardFunc+" "+redoGuardTrigger+" COMMIT;"); err != nil {
			return false, nil, fmt.Errorf("creating the event trigger: %w", err)
		}
	case body == nil || *body != redoGuardBody:
		if _, err := conn.Exec(ctx, redoGuardFunc); err != nil {
			return false, nil, fmt.Errorf("updating the guard function: %w", err)
		}
	}
	rows, err := conn.Query(ctx, `SELECT format('%s (%s)', c.oid::regclass, am.amname) FROM pg_class c JOIN pg_am am ON am.oid = c.relam
		WHERE c.relkind IN ('i', 'I') AND c.relpersistence <> 't' AND am.amname NOT IN (`+redoIndexAMs+`) ORDER BY 1`)
	if err != nil {
		return !exists, nil, err
	}
	unsupported, err = pgx.CollectRows(rows, pgx.RowTo[string])
	return !exists, unsupported, err
}

// connValue quotes a libpq keyword/value connection string value.
func connValue(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}
