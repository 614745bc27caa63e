// Package relpath classifies the paths of a PostgreSQL 15 data directory
// (PGDATA): which files are relation segments (and of which relation fork and
// segment), which are WAL, which are local-only, and which are ordinary files.
//
// It works on slash-separated paths relative to PGDATA ("base/5/16384.1") and
// does no I/O. It is not a general Postgres path library: it knows the
// layout of PostgreSQL 15 only (TABLESPACE_VERSION_DIRECTORY PG_15_202209061).
package relpath

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/stratadb/strata/sdk/pg"
)

// SegmentBlocks is RELSEG_SIZE: the number of blocks in one relation segment
// file (1 GiB of 8 KiB pages).
const SegmentBlocks = 131072

// TablespaceVersionDir is the per-version folder inside a tablespace
// (pg_tblspc/<spc>/PG_15_202209061/<db>/<rel>).
const TablespaceVersionDir = "PG_15_202209061"

// ErrNotRelation is returned by ParseRel for a path that is not a relation
// segment file.
var ErrNotRelation = errors.New("relpath: not a relation file")

// Kind says how the compute stores a PGDATA file.
type Kind uint8

const (
	// KindOther is an ordinary file (pg_control, pg_xact pages, configs...):
	// stored whole in storage, tagged with the WAL position.
	KindOther Kind = iota
	// KindRel is a relation segment file: served page by page.
	KindRel
	// KindWAL is a file under pg_wal: local scratch (the safekeepers hold WAL).
	KindWAL
	// KindLocal is a file that must not outlive the compute (postmaster.pid,
	// postmaster.opts, pg_stat_tmp, temporary files): kept in memory only.
	KindLocal
)

// String names the kind for metrics labels.
func (k Kind) String() string {
	switch k {
	case KindRel:
		return "rel"
	case KindWAL:
		return "wal"
	case KindLocal:
		return "local"
	}
	return "other"
}

// Seg is a relation segment file: a relation fork and the segment number
// (0 for the file without a ".N" suffix).
type Seg struct {
	Rel pg.RelTag
	No  uint32
}

// FirstBlock returns the number of the first block stored in the segment.
func (s Seg) FirstBlock() uint32 { return s.No * SegmentBlocks }

// Path returns the PGDATA-relative path of the segment file.
func (s Seg) Path() string {
	p := RelPath(s.Rel)
	if s.No > 0 {
		p += "." + strconv.FormatUint(uint64(s.No), 10)
	}
	return p
}

// RelPath returns the path of the first segment of a relation fork, like
// Postgres' relpathperm.
func RelPath(r pg.RelTag) string {
	name := strconv.FormatUint(uint64(r.Rel), 10)
	if r.Fork != pg.MainFork {
		name += "_" + r.Fork.String()
	}
	switch r.Spc {
	case pg.GlobalTablespaceOID:
		return "global/" + name
	case pg.DefaultTablespaceOID:
		return fmt.Sprintf("base/%d/%s", r.DB, name)
	}
	return fmt.Sprintf("pg_tblspc/%d/%s/%d/%s", r.Spc, TablespaceVersionDir, r.DB, name)
}

// Classify returns the kind of the file at path (relative to PGDATA,
// slash-separated, no leading slash).
func Classify(path string) Kind {
	if path == "pg_wal" || strings.HasPrefix(path, "pg_wal/") {
		return KindWAL
	}
	if _, err := ParseRel(path); err == nil {
		return KindRel
	}
	switch path {
	case "postmaster.pid", "postmaster.opts":
		return KindLocal
	}
	if strings.HasPrefix(path, "pg_stat_tmp/") {
		return KindLocal
	}
	for _, part := range strings.Split(path, "/") {
		if part == "pgsql_tmp" || strings.HasPrefix(part, "pgsql_tmp") {
			return KindLocal
		}
	}
	// Temporary relations (t<backend>_<relfilenode>[...]) die with the compute.
	if dir, base := splitDir(path); isRelDir(dir) && isTempRelName(base) {
		return KindLocal
	}
	return KindOther
}

// ParseRel parses a relation segment path: base/<db>/<rel>[_fsm|_vm|_init][.N],
// global/<rel>[...], or pg_tblspc/<spc>/PG_15_.../<db>/<rel>[...].
func ParseRel(path string) (Seg, error) {
	dir, base := splitDir(path)
	var tag pg.RelTag
	parts := strings.Split(dir, "/")
	switch {
	case len(parts) == 1 && parts[0] == "global":
		tag.Spc, tag.DB = pg.GlobalTablespaceOID, 0
	case len(parts) == 2 && parts[0] == "base":
		db, ok := parseOID(parts[1])
		if !ok {
			return Seg{}, fmt.Errorf("%w: %q", ErrNotRelation, path)
		}
		tag.Spc, tag.DB = pg.DefaultTablespaceOID, db
	case len(parts) == 4 && parts[0] == "pg_tblspc" && parts[2] == TablespaceVersionDir:
		spc, ok1 := parseOID(parts[1])
		db, ok2 := parseOID(parts[3])
		if !ok1 || !ok2 {
			return Seg{}, fmt.Errorf("%w: %q", ErrNotRelation, path)
		}
		tag.Spc, tag.DB = spc, db
	default:
		return Seg{}, fmt.Errorf("%w: %q", ErrNotRelation, path)
	}
	name, segStr, hasSeg := strings.Cut(base, ".")
	var segNo uint32
	if hasSeg {
		n, ok := parseOID(segStr)
		if !ok || n == 0 {
			return Seg{}, fmt.Errorf("%w: %q", ErrNotRelation, path)
		}
		segNo = n
	}
	relStr, forkStr, hasFork := strings.Cut(name, "_")
	if hasFork {
		switch forkStr {
		case "fsm":
			tag.Fork = pg.FSMFork
		case "vm":
			tag.Fork = pg.VMFork
		case "init":
			tag.Fork = pg.InitFork
		default:
			return Seg{}, fmt.Errorf("%w: %q", ErrNotRelation, path)
		}
	}
	rel, ok := parseOID(relStr)
	if !ok || rel == 0 {
		return Seg{}, fmt.Errorf("%w: %q", ErrNotRelation, path)
	}
	tag.Rel = rel
	return Seg{Rel: tag, No: segNo}, nil
}

func splitDir(path string) (dir, base string) {
	i := strings.LastIndexByte(path, '/')
	if i < 0 {
		return "", path
	}
	return path[:i], path[i+1:]
}

func isRelDir(dir string) bool {
	parts := strings.Split(dir, "/")
	switch {
	case len(parts) == 1 && parts[0] == "global":
		return true
	case len(parts) == 2 && parts[0] == "base":
		return true
	case len(parts) == 4 && parts[0] == "pg_tblspc":
		return true
	}
	return false
}

func isTempRelName(base string) bool {
	if len(base) < 4 || base[0] != 't' {
		return false
	}
	b, rest, ok := strings.Cut(base[1:], "_")
	if !ok {
		return false
	}
	if _, ok := parseOID(b); !ok {
		return false
	}
	name, _, _ := strings.Cut(rest, ".")
	name, _, _ = strings.Cut(name, "_")
	_, ok = parseOID(name)
	return ok
}

// parseOID parses a decimal uint32 without sign, leading zeros or spaces.
func parseOID(s string) (uint32, bool) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, false
	}
	return uint32(v), true
}
