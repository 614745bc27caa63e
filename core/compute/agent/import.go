package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/stratadb/strata/core/compute/psbackend"
	"github.com/stratadb/strata/core/compute/walpos"
	"github.com/stratadb/strata/internal/pgcontrol"
	"github.com/stratadb/strata/sdk/pg"
)

// ErrImport: the folder given to import (Config.ImportFrom) cannot become
// a strata cluster as it is; the error says why and what to do.
var ErrImport = errors.New("agent: import")

// A new cluster may start from an existing PostgreSQL 15 data directory
// instead of initdb (Config.ImportFrom, `strata up --import DIR`): a copy
// that `strata restore` wrote, or any cleanly stopped server's folder. The
// folder is only read. Its WAL from the last checkpoint on goes into the
// WAL scratch folder before the mount is made (the mount's W starts at
// that checkpoint), then every other file is copied into the mount with
// pg_control last, as initdb's output is: the copy's writes wait for the
// safekeepers' commit LSN like any compute write, so a copy cut short
// leaves nothing durable and the next start imports again. strata's
// pg_hba.conf replaces the folder's (kept as pg_hba.conf.imported), and
// once Postgres runs, the superuser's password becomes the new cluster's.
//
// The new cluster gets a system identifier of its own (importSystemID),
// written into pg_control and into the long page header of each WAL
// segment copied: otherwise it would share the folder's with the cluster
// the folder came from (and with every other import of it), and their
// WAL archives, kept by system identifier, would mix. Postgres checks the
// identifier nowhere else (data pages do not hold it).

// CheckImport reports whether dir can be imported: a PostgreSQL 15 data
// directory, shut down cleanly (not a standby's), with no tablespaces,
// the WAL of its last checkpoint in pg_wal, and none of the settings in
// managed (those strata writes into strata.conf) in postgresql.auto.conf,
// which would override them. It returns the folder's pg_control.
func CheckImport(dir string, managed []string) (Control, error) {
	bad := func(format string, args ...any) (Control, error) {
		return Control{}, fmt.Errorf("%w: %s: %s", ErrImport, dir, fmt.Sprintf(format, args...))
	}
	if !filepath.IsAbs(dir) {
		return bad("give an absolute path")
	}
	v, err := os.ReadFile(filepath.Join(dir, "PG_VERSION"))
	if err != nil {
		return bad("not a PostgreSQL data directory (%v)", err)
	}
	if got := strings.TrimSpace(string(v)); got != "15" {
		return bad("a PostgreSQL %s data directory; strata runs PostgreSQL 15 (upgrade it with pg_upgrade first)", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "postmaster.pid")); err == nil {
		return bad("postmaster.pid exists: a server runs on it, or it was not shut down cleanly; stop it with pg_ctl stop -m fast")
	}
	b, err := os.ReadFile(filepath.Join(dir, ControlFile))
	if err != nil {
		return bad("%v", err)
	}
	ctl, err := ParseControl(b)
	if err != nil {
		return bad("%v", err)
	}
	switch ctl.State {
	case dbShutdowned:
	case dbShutdownedInRecovery:
		return bad("a standby's folder (pg_control: shut down in recovery); promote the standby and stop it cleanly, then import it")
	default:
		return bad("not shut down cleanly (pg_control state %d); start it, let it recover, and stop it with pg_ctl stop -m fast", ctl.State)
	}
	if ents, err := os.ReadDir(filepath.Join(dir, "pg_tblspc")); err == nil && len(ents) > 0 {
		return bad("it has %d tablespaces (pg_tblspc); strata keeps a cluster in one data directory: move their tables to pg_default first (ALTER TABLE ... SET TABLESPACE pg_default)", len(ents))
	}
	seg := walpos.FormatSegmentName(ctl.Timeline, uint64(ctl.Checkpoint)/pg.WALSegmentSize, pg.WALSegmentSize)
	info, err := os.Stat(filepath.Join(dir, "pg_wal", seg))
	if err != nil {
		return bad("the WAL of its last checkpoint (%s, segment %s) is not in pg_wal: %v", ctl.Checkpoint, seg, err)
	}
	if info.Size() != int64(pg.WALSegmentSize) {
		return bad("WAL segment %s is %d bytes; strata uses 16 MiB segments (initdb --wal-segsize=16)", seg, info.Size())
	}
	for _, name := range []string{"postgresql.conf", "pg_hba.conf"} {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return bad("no %s in the folder (%v); a Debian cluster keeps its configuration in /etc/postgresql/15/<name>: copy postgresql.conf, pg_hba.conf and pg_ident.conf from there into the folder first", name, err)
		}
	}
	if keys, err := autoConfKeys(filepath.Join(dir, "postgresql.conf")); err != nil {
		return bad("%v", err)
	} else if elsewhere := clashing(keys, []string{"data_directory", "hba_file", "ident_file", "external_pid_file"}); len(elsewhere) > 0 {
		return bad("postgresql.conf sets %s: strata keeps the configuration files in the data directory; comment them out (and copy the files they name into the folder) and import again", strings.Join(elsewhere, ", "))
	}
	if keys, err := autoConfKeys(filepath.Join(dir, "postgresql.auto.conf")); err != nil {
		return bad("%v", err)
	} else if clash := clashing(keys, managed); len(clash) > 0 {
		return bad("postgresql.auto.conf sets %s, which strata manages (it would override strata.conf); remove them (ALTER SYSTEM RESET <name>, or edit the file) and import again", strings.Join(clash, ", "))
	}
	return ctl, nil
}

// autoConfKeys returns the setting names in a configuration file such as
// postgresql.auto.conf (none when it does not exist).
func autoConfKeys(path string) ([]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok {
			k, _, _ = strings.Cut(line, " ")
		}
		keys = append(keys, strings.ToLower(strings.TrimSpace(k)))
	}
	return keys, sc.Err()
}

func clashing(keys, managed []string) []string {
	var out []string
	for _, k := range keys {
		if slices.Contains(managed, k) && !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// importSystemID is the system identifier of a cluster imported into
// strata timeline tl from a folder of system old: new, and the same at
// every start.
func importSystemID(old uint64, tl pg.TimelineID) uint64 {
	var b [8 + 16]byte
	binary.LittleEndian.PutUint64(b[:], old)
	copy(b[8:], tl[:])
	sum := sha256.Sum256(append([]byte("strata import "), b[:]...))
	// Below 2^63, as initdb's are: SQL shows it as a bigint
	// (pg_control_system()), and it should read as the same number there
	// as in the archive's keys.
	return binary.LittleEndian.Uint64(sum[:]) &^ (1 << 63)
}

// importWAL copies the folder's WAL that a start needs into the WAL
// scratch folder walDir, owned by uid/gid: the segment of its last
// checkpoint (a clean shutdown's is its last record) and the segments
// after it that continue that WAL (a record may cross into the next one;
// later files are preallocated or recycled ones, which Postgres rewrites),
// each with system identifier sysID in its long page header, and the
// timeline history files.
func importWAL(dir, walDir string, ctl Control, sysID uint64, uid, gid int) (int, error) {
	if err := os.MkdirAll(walDir, 0o700); err != nil {
		return 0, err
	}
	if err := os.Chown(walDir, uid, gid); err != nil {
		return 0, err
	}
	src := filepath.Join(dir, "pg_wal")
	ents, err := os.ReadDir(src)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range ents {
		if name := e.Name(); strings.HasSuffix(name, ".history") && e.Type().IsRegular() {
			b, err := os.ReadFile(filepath.Join(src, name))
			if err != nil {
				return n, err
			}
			if err := writeOwned(filepath.Join(walDir, name), b, uid, gid); err != nil {
				return n, err
			}
			n++
		}
	}
	first := uint64(ctl.Checkpoint) / pg.WALSegmentSize
	for no := first; ; no++ {
		name := walpos.FormatSegmentName(ctl.Timeline, no, pg.WALSegmentSize)
		b, err := os.ReadFile(filepath.Join(src, name))
		if errors.Is(err, os.ErrNotExist) && no > first {
			break
		}
		if err != nil {
			return n, err
		}
		le := binary.LittleEndian
		if len(b) < pgcontrol.WALSystemIDOffset+8 || le.Uint64(b[8:]) != no*pg.WALSegmentSize {
			if no == first {
				return n, fmt.Errorf("%w: %s: WAL segment %s does not begin at its own position", ErrImport, dir, name)
			}
			break // preallocated or recycled: not this WAL
		}
		if got := le.Uint64(b[pgcontrol.WALSystemIDOffset:]); got != ctl.SystemID {
			return n, fmt.Errorf("%w: %s: WAL segment %s is of system %d, pg_control of %d", ErrImport, dir, name, got, ctl.SystemID)
		}
		le.PutUint64(b[pgcontrol.WALSystemIDOffset:], sysID)
		if err := writeOwned(filepath.Join(walDir, name), b, uid, gid); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

func writeOwned(path string, b []byte, uid, gid int) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	return os.Chown(path, uid, gid)
}

// importData copies the folder's files into the mount: all but pg_wal
// (importWAL placed its WAL), postmaster.opts, restore.log and the
// replication slots (which would hold WAL for ever), with strata's
// pg_hba.conf and the include of strata.conf, and pg_control, with system
// identifier sysID, last. The files it changes are made in a staging
// folder of the scratch space first: every write to the mount is a cp
// child's (see copyTree).
func (a *Agent) importData(ctx context.Context, dir string, sysID uint64) error {
	t0 := time.Now()
	stage := filepath.Join(a.cfg.Scratch, "import")
	if err := os.RemoveAll(stage); err != nil {
		return err
	}
	defer os.RemoveAll(stage)
	if err := os.MkdirAll(filepath.Join(stage, "global"), 0o700); err != nil {
		return err
	}
	if err := os.Mkdir(filepath.Join(stage, "pg_replslot"), 0o700); err != nil {
		return err
	}
	if a.wal.link {
		if err := os.Symlink(a.wal.dir, filepath.Join(stage, "pg_wal")); err != nil {
			return err
		}
	} else if err := os.Mkdir(filepath.Join(stage, "pg_wal"), 0o700); err != nil {
		return err
	}
	for _, name := range []string{"postgresql.conf", "pg_hba.conf"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrImport, dir, err)
		}
		if err := os.WriteFile(filepath.Join(stage, name), b, 0o600); err != nil {
			return err
		}
	}
	s := *a.pgs
	s.DataDir = stage
	if err := s.Adopt(); err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(dir, ControlFile))
	if err != nil {
		return err
	}
	if b, err = WithSystemID(b, sysID); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrImport, dir, err)
	}
	if err := os.WriteFile(filepath.Join(stage, ControlFile), b, 0o600); err != nil {
		return err
	}

	skip := map[string]bool{"pg_wal": true, "postmaster.opts": true, "restore.log": true, "pg_replslot": true,
		"postgresql.conf": true, "pg_hba.conf": true, ControlFile: true,
		psbackend.DirsFile: true} // strata's own record, in copies restored before it was left out
	if _, total, err := treeSize(dir, skip); err == nil {
		a.sp.update(func(p *Progress) { p.ImportBytes = total })
	}
	files, size, err := copyTreeSkipping(ctx, dir, a.cfg.Mountpoint, skip)
	if err != nil {
		return fmt.Errorf("agent: import: copying %s into the mount: %w", dir, err)
	}
	staged, err := os.ReadDir(stage)
	if err != nil {
		return err
	}
	for _, e := range staged {
		if e.Name() == "global" {
			continue
		}
		if err := cp(ctx, filepath.Join(stage, e.Name()), filepath.Join(a.cfg.Mountpoint, e.Name())); err != nil {
			return fmt.Errorf("agent: import: %w", err)
		}
	}
	if err := cp(ctx, filepath.Join(stage, ControlFile), filepath.Join(a.cfg.Mountpoint, ControlFile)); err != nil {
		return fmt.Errorf("agent: import: %w", err)
	}
	a.log.Info().Str("from", dir).Int("files", files).Int64("bytes", size).Uint64("system_id", sysID).Dur("took", time.Since(t0)).Msg("data directory imported into the mount")
	return nil
}

// checkImported refuses ImportFrom on a cluster that holds files
// already (stored is its pg_control): an import makes a new cluster. (An
// agent its supervisor starts again after a crash is started without
// ImportFrom.)
func (a *Agent) checkImported(stored Control) error {
	dir := a.cfg.ImportFrom
	if dir == "" {
		return nil
	}
	what := "another database"
	if b, err := os.ReadFile(filepath.Join(dir, ControlFile)); err == nil {
		if ctl, err := ParseControl(b); err == nil && importSystemID(ctl.SystemID, a.cfg.Timeline) == stored.SystemID {
			what = "this import already"
		}
	}
	return fmt.Errorf("%w: %s: the cluster holds %s (system %d); an import makes a new cluster: start this one without --import, or give a new cluster.data_dir for the import", ErrImport, dir, what, stored.SystemID)
}

// setSuperuserPassword gives the superuser the cluster's password
// (Config.Password), committing locally as ensureReplUser does.
func (a *Agent) setSuperuserPassword(ctx context.Context) error {
	return a.localExec(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "ALTER ROLE postgres PASSWORD "+quoteLiteral(a.cfg.Password))
		return err
	})
}
