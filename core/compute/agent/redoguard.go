package agent

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

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

// ensureRedoGuard installs the index guard in every database that accepts
// connections and has none (template1's copy reaches the databases created
// from it later; one created from template0 gets it at the next start). A
// guard an operator disabled (ALTER EVENT TRIGGER ... DISABLE) stays
// disabled. Indexes of other types already there are logged: their pages
// cannot be read back from the pageserver once the compute evicts them.
// A database the agent cannot reach is logged and skipped: the guard is a
// safety net, not a reason to keep Postgres from serving.
func (a *Agent) ensureRedoGuard(ctx context.Context) {
	conn, err := pgx.Connect(ctx, a.socketConn())
	if err != nil {
		a.log.Warn().Err(err).Msg("redo index guard: listing the databases")
		return
	}
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE datallowconn ORDER BY datname")
	var dbs []string
	if err == nil {
		dbs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	conn.Close(ctx)
	if err != nil {
		a.log.Warn().Err(err).Msg("redo index guard: listing the databases")
		return
	}
	for _, db := range dbs {
		installed, unsupported, err := a.redoGuardDB(ctx, db)
		if err != nil {
			a.log.Warn().Err(err).Str("database", db).Msg("redo index guard not installed")
			continue
		}
		if installed {
			a.log.Info().Str("database", db).Msg("redo index guard installed: CREATE INDEX of a method whose WAL strata does not replay fails")
		}
		if len(unsupported) > 0 {
			a.log.Warn().Str("database", db).Strs("indexes", unsupported).
				Msg("indexes the redo engine cannot rebuild from WAL: reading their pages from the pageserver fails; drop them or run in writeback mode")
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
