package pageserver

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"time"

	"github.com/stratadb/strata/core/pageserver/keyspace"
	"github.com/stratadb/strata/core/pageserver/timeline"
	"github.com/stratadb/strata/internal/pgcontrol"
	"github.com/stratadb/strata/plugins/redo/postgres/wal"
	"github.com/stratadb/strata/sdk/pg"
)

// DataDirDirs are the directories of a PostgreSQL 15 data directory that
// must exist (possibly empty) for the server to start.
var DataDirDirs = []string{
	"base", "global", "pg_commit_ts", "pg_dynshmem", "pg_logical", "pg_logical/mappings",
	"pg_logical/snapshots", "pg_multixact", "pg_multixact/members", "pg_multixact/offsets",
	"pg_notify", "pg_replslot", "pg_serial", "pg_snapshots", "pg_stat", "pg_stat_tmp",
	"pg_subtrans", "pg_tblspc", "pg_twophase", "pg_wal", "pg_wal/archive_status", "pg_xact",
}

// RelSegmentBlocks is the number of blocks per relation segment file (1 GiB).
const RelSegmentBlocks = 131072

// TablespaceVersionDir is PG 15's per-version directory inside a tablespace.
const TablespaceVersionDir = "PG_15_202209061"

// RelPath returns the data-directory path of segment seg of a relation fork.
func RelPath(r pg.RelTag, seg uint32) string {
	var p string
	switch r.Spc {
	case pg.GlobalTablespaceOID:
		p = fmt.Sprintf("global/%d", r.Rel)
	case pg.DefaultTablespaceOID:
		p = fmt.Sprintf("base/%d/%d", r.DB, r.Rel)
	default:
		p = fmt.Sprintf("pg_tblspc/%d/%s/%d/%d", r.Spc, TablespaceVersionDir, r.DB, r.Rel)
	}
	if r.Fork != pg.MainFork {
		p += "_" + r.Fork.String()
	}
	if seg > 0 {
		p += fmt.Sprintf(".%d", seg)
	}
	return p
}

// Basebackup writes a tar of the data directory at lsn: every non-relation
// file, then every relation fork (split into 1 GiB segments), page by page.
// In writeback mode the tar is what the newest versions at or below lsn
// hold; Postgres' crash recovery makes it consistent (DESIGN.md 3a).
// For a timeline built from WAL alone (redo mode) see BasebackupFromWAL.
func Basebackup(ctx context.Context, tl *timeline.Timeline, lsn pg.LSN, w io.Writer) error {
	return basebackup(ctx, tl, lsn, w, backupOptions{})
}

// backupOptions adapt basebackup to a redo-mode timeline.
type backupOptions struct {
	skipFork  func(pg.RelTag) bool // leave these relation forks out
	overrides map[string][]byte    // write these contents instead of the stored ones
}

func basebackup(ctx context.Context, tl *timeline.Timeline, lsn pg.LSN, w io.Writer, o backupOptions) error {
	tw := tar.NewWriter(w)
	mod := time.Unix(0, 0)
	files, err := tl.ListFiles(ctx, lsn)
	if err != nil {
		return err
	}
	all, err := tl.ListRels(ctx, keyspace.RelsRange, lsn)
	if err != nil {
		return err
	}
	rels := all[:0]
	for _, r := range all {
		if o.skipFork == nil || !o.skipFork(r) {
			rels = append(rels, r)
		}
	}
	// Directories first: Postgres' fixed ones (empty ones included), then
	// every parent of a file.
	dirs := map[string]bool{}
	var order []string
	addDir := func(d string) {
		for d != "." && d != "" && !dirs[d] {
			dirs[d] = true
			order = append(order, d)
			d = path.Dir(d)
		}
	}
	for _, d := range DataDirDirs {
		addDir(d)
	}
	for _, f := range files {
		addDir(path.Dir(f.Path))
	}
	for _, r := range rels {
		addDir(path.Dir(RelPath(r, 0)))
	}
	sort.Strings(order)
	for _, d := range order {
		if err := tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o700, ModTime: mod, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	for _, f := range files {
		data, ok := o.overrides[f.Path]
		if !ok {
			data, err = tl.ReadFile(ctx, f.Path, lsn)
			if err != nil {
				return fmt.Errorf("basebackup: %s: %w", f.Path, err)
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Path, Mode: 0o600, Size: int64(len(data)), ModTime: mod, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	for _, r := range rels {
		n, _, err := tl.Nblocks(ctx, r, lsn)
		if err != nil {
			return err
		}
		for seg := uint32(0); seg == 0 || seg*RelSegmentBlocks < n; seg++ {
			first := seg * RelSegmentBlocks
			cnt := min(n-first, RelSegmentBlocks)
			if n == 0 {
				cnt = 0
			}
			hdr := &tar.Header{Name: RelPath(r, seg), Mode: 0o600, Size: int64(cnt) * pg.BlockSize, ModTime: mod, Typeflag: tar.TypeReg}
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			for b := first; b < first+cnt; b++ {
				page, err := tl.GetPage(ctx, r.Page(b), lsn, 0)
				if err != nil {
					return fmt.Errorf("basebackup: %s: %w", r.Page(b), err)
				}
				if _, err := tw.Write(page); err != nil {
					return err
				}
			}
		}
	}
	return tw.Close()
}

// Basebackup from WAL alone (redo mode).
//
// A redo-mode timeline holds what WAL ingest stored on top of the imported
// initdb base: relation pages rebuilt from WAL, pg_xact, relation maps,
// PG_VERSION files. It holds no pg_control newer than initdb's and no FSM
// page newer than initdb's (Postgres does not WAL-log them).
// BasebackupFromWAL therefore writes every page at lsn, leaves FSM forks out
// (Postgres recreates them: the FSM is a hint, and a missing fork means "no
// free space known"), and writes a pg_control rebuilt from a checkpoint
// record at or below lsn, marked "in production" so that Postgres runs
// crash recovery from that checkpoint's REDO point. The caller puts the WAL
// from Checkpoint.Redo to at least lsn into pg_wal (from the safekeepers or
// the archive): pages newer than the REDO point are normal in crash
// recovery, exactly as in an online base backup (DESIGN.md 3a).

// Checkpoint is a checkpoint record found in WAL.
type Checkpoint struct {
	LSN      pg.LSN // where the record starts (pg_control's checkPoint)
	EndLSN   pg.LSN
	Redo     pg.LSN // its REDO point: crash recovery replays WAL from here
	Timeline uint32 // ThisTimeLineID
	Shutdown bool
	// Data is the record's CheckPoint struct, copied into pg_control's
	// checkPointCopy.
	Data []byte
}

// Sentinel errors of the WAL-only basebackup.
var (
	// ErrNoCheckpoint: no checkpoint record in the WAL range searched.
	ErrNoCheckpoint = errors.New("pageserver: no checkpoint record found")
	// ErrBadControl: the stored pg_control is not PostgreSQL 15's.
	ErrBadControl = errors.New("pageserver: unexpected pg_control layout")
)

const (
	xlogCheckpointShutdown = 0x00 // XLOG_CHECKPOINT_SHUTDOWN
	xlogCheckpointOnline   = 0x10 // XLOG_CHECKPOINT_ONLINE
	checkpointSize         = 88   // sizeof(CheckPoint) in PostgreSQL 15 on 64-bit
	checkpointTimeOffset   = 64   // offsetof(CheckPoint, time)
)

// ParseCheckpoint recognises a checkpoint record (XLOG CHECKPOINT_SHUTDOWN
// or CHECKPOINT_ONLINE).
func ParseCheckpoint(r *wal.Record) (Checkpoint, bool) {
	if r.RmID != wal.RmXLOG || len(r.MainData) < checkpointSize {
		return Checkpoint{}, false
	}
	info := r.Info & 0xF0
	if info != xlogCheckpointShutdown && info != xlogCheckpointOnline {
		return Checkpoint{}, false
	}
	d := r.MainData[:checkpointSize]
	return Checkpoint{
		LSN: r.LSN, EndLSN: r.EndLSN, Shutdown: info == xlogCheckpointShutdown,
		Redo:     pg.LSN(binary.LittleEndian.Uint64(d)),
		Timeline: binary.LittleEndian.Uint32(d[8:]),
		Data:     bytes.Clone(d),
	}, true
}

// FindCheckpoint reads WAL from src, from the first record at or after
// from, and returns the last checkpoint record that ends at or below upto.
// The end of the WAL in src ends the search.
func FindCheckpoint(src wal.Source, from, upto pg.LSN) (Checkpoint, error) {
	rd := wal.NewReader(src, from)
	var best Checkpoint
	found := false
	for {
		r, err := rd.Next()
		if errors.Is(err, wal.ErrEndOfWAL) {
			break
		}
		if err != nil {
			return Checkpoint{}, err
		}
		if r.EndLSN > upto {
			break
		}
		if c, ok := ParseCheckpoint(r); ok {
			best, found = c, true
		}
	}
	if !found {
		return Checkpoint{}, fmt.Errorf("%w between %s and %s", ErrNoCheckpoint, from, upto)
	}
	return best, nil
}

// PostgreSQL 15 ControlFileData offsets (64-bit).
const (
	ctlState         = 16  // DBState
	ctlTime          = 24  // pg_time_t
	ctlCheckPoint    = 32  // XLogRecPtr
	ctlCheckPointCpy = 40  // CheckPoint (88 bytes)
	ctlMinRecovery   = 136 // minRecoveryPoint, minRecoveryPointTLI (+4)
	ctlBackupStart   = 152 // backupStartPoint, backupEndPoint, backupEndRequired
	dbInProduction   = 6   // DB_IN_PRODUCTION
)

// ControlFromCheckpoint returns a copy of pg_control (PostgreSQL 15, as
// initdb wrote it) that names checkpoint c, with the state "in production"
// (so the server runs crash recovery from c.Redo), no minimum recovery
// point and no backup in progress, and a fresh CRC. The CRC of ctl is
// checked first, which also checks the layout this function assumes.
func ControlFromCheckpoint(ctl []byte, c Checkpoint, now time.Time) ([]byte, error) {
	if len(c.Data) != checkpointSize {
		return nil, fmt.Errorf("%w: checkpoint of %d bytes", ErrBadControl, len(c.Data))
	}
	return rewriteControl(ctl, func(out []byte) {
		binary.LittleEndian.PutUint32(out[ctlState:], dbInProduction)
		binary.LittleEndian.PutUint64(out[ctlTime:], uint64(now.Unix()))
		binary.LittleEndian.PutUint64(out[ctlCheckPoint:], uint64(c.LSN))
		copy(out[ctlCheckPointCpy:ctlCheckPointCpy+checkpointSize], c.Data)
		clear(out[ctlMinRecovery : ctlMinRecovery+12])
		clear(out[ctlBackupStart : ctlBackupStart+17])
	})
}

// checkControl checks that ctl is PostgreSQL 15's pg_control with a CRC
// that matches (which also checks the layout the offsets above assume).
func checkControl(ctl []byte) error {
	if err := pgcontrol.Check(ctl); err != nil {
		return fmt.Errorf("%w: %v", ErrBadControl, err)
	}
	return nil
}

// rewriteControl is pgcontrol.Rewrite with its errors ErrBadControl.
func rewriteControl(ctl []byte, change func(out []byte)) ([]byte, error) {
	out, err := pgcontrol.Rewrite(ctl, change)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadControl, err)
	}
	return out, nil
}

// ControlWithMinRecoveryPoint returns a copy of pg_control (checked
// first) with the minimum recovery point set to lsn on PostgreSQL
// timeline tli, no backup in progress, and a fresh CRC: archive recovery
// from it refuses to stop, or to call the server consistent, before lsn.
func ControlWithMinRecoveryPoint(ctl []byte, lsn pg.LSN, tli pg.PGTimeline) ([]byte, error) {
	return rewriteControl(ctl, func(out []byte) {
		binary.LittleEndian.PutUint64(out[ctlMinRecovery:], uint64(lsn))
		binary.LittleEndian.PutUint32(out[ctlMinRecovery+8:], uint32(tli))
		clear(out[ctlBackupStart : ctlBackupStart+17])
	})
}

// ControlCheckpointTime returns the time (whole seconds, when it began)
// of the checkpoint pg_control names (checkPointCopy.time).
func ControlCheckpointTime(ctl []byte) (time.Time, error) {
	if err := checkControl(ctl); err != nil {
		return time.Time{}, err
	}
	return time.Unix(int64(binary.LittleEndian.Uint64(ctl[ctlCheckPointCpy+checkpointTimeOffset:])), 0), nil
}

// BasebackupFromWAL writes a tar of a redo-mode timeline's data directory
// at lsn that a stock PostgreSQL 15 starts from: every relation page at lsn
// (rebuilt from WAL), every non-relation file at lsn, FSM forks left out,
// and pg_control rebuilt from checkpoint c (see ControlFromCheckpoint).
// pg_wal is empty: the caller must put there the WAL from c.Redo to at
// least lsn before starting Postgres, which then replays it (crash
// recovery) to the end of what it finds.
//
// REQUIRES: c is a checkpoint record of this timeline's WAL ending at or
// below lsn (FindCheckpoint finds one).
func BasebackupFromWAL(ctx context.Context, tl *timeline.Timeline, lsn pg.LSN, c Checkpoint, now time.Time, w io.Writer) error {
	if c.EndLSN > lsn {
		return fmt.Errorf("pageserver: checkpoint at %s ends after the backup LSN %s", c.LSN, lsn)
	}
	ctl, err := tl.ReadFile(ctx, ControlFile, lsn)
	if err != nil {
		return fmt.Errorf("basebackup: %s: %w", ControlFile, err)
	}
	ctl, err = ControlFromCheckpoint(ctl, c, now)
	if err != nil {
		return err
	}
	return basebackup(ctx, tl, lsn, w, backupOptions{
		skipFork:  func(r pg.RelTag) bool { return r.Fork == pg.FSMFork },
		overrides: map[string][]byte{ControlFile: ctl},
	})
}

// ControlFile is pg_control's path in a data directory.
const ControlFile = "global/pg_control"
