package relpath

import (
	"errors"
	"testing"

	"github.com/stratadb/strata/sdk/pg"
)

func TestParseRel(t *testing.T) {
	for _, tc := range []struct {
		path string
		want Seg
	}{
		{"base/5/16384", Seg{pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}, 0}},
		{"base/5/16384.1", Seg{pg.RelTag{Spc: 1663, DB: 5, Rel: 16384}, 1}},
		{"base/5/16384_fsm", Seg{pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.FSMFork}, 0}},
		{"base/5/16384_vm.12", Seg{pg.RelTag{Spc: 1663, DB: 5, Rel: 16384, Fork: pg.VMFork}, 12}},
		{"base/1/2836_init", Seg{pg.RelTag{Spc: 1663, DB: 1, Rel: 2836, Fork: pg.InitFork}, 0}},
		{"global/1262", Seg{pg.RelTag{Spc: 1664, DB: 0, Rel: 1262}, 0}},
		{"global/1262_vm", Seg{pg.RelTag{Spc: 1664, DB: 0, Rel: 1262, Fork: pg.VMFork}, 0}},
		{"pg_tblspc/16390/PG_15_202209061/5/16391.3", Seg{pg.RelTag{Spc: 16390, DB: 5, Rel: 16391}, 3}},
		{"base/4294967295/4294967295", Seg{pg.RelTag{Spc: 1663, DB: 4294967295, Rel: 4294967295}, 0}},
	} {
		got, err := ParseRel(tc.path)
		if err != nil || got != tc.want {
			t.Errorf("ParseRel(%q) = %+v, %v; want %+v", tc.path, got, err, tc.want)
			continue
		}
		if got.Path() != tc.path {
			t.Errorf("Path() = %q; want %q", got.Path(), tc.path)
		}
		if Classify(tc.path) != KindRel {
			t.Errorf("Classify(%q) = %v", tc.path, Classify(tc.path))
		}
	}
}

func TestParseRelRejects(t *testing.T) {
	for _, p := range []string{
		"base/5/PG_VERSION", "base/5/pg_filenode.map", "base/5/pg_internal.init",
		"global/pg_control", "global/pg_filenode.map", "base/5/16384.0", "base/5/16384.",
		"base/5/016384", "base/5/16384_xyz", "base/5/0", "base/x/16384", "base/5/6/16384",
		"pg_tblspc/16390/PG_14_202107181/5/16391", "16384", "base/5/4294967296",
		"base/5/t3_16384", "base/5/16384_fsm_vm", "pg_xact/0000", "base/5/16384.1.2",
		"pg_wal/000000010000000000000001", "base/5/-1",
	} {
		if s, err := ParseRel(p); !errors.Is(err, ErrNotRelation) {
			t.Errorf("ParseRel(%q) = %+v, %v; want ErrNotRelation", p, s, err)
		}
	}
}

func TestClassify(t *testing.T) {
	for p, want := range map[string]Kind{
		"pg_wal":                                  KindWAL,
		"pg_wal/000000010000000000000001":         KindWAL,
		"pg_wal/archive_status/0001.done":         KindWAL,
		"pg_walx":                                 KindOther,
		"postmaster.pid":                          KindLocal,
		"postmaster.opts":                         KindLocal,
		"pg_stat_tmp/global.stat":                 KindLocal,
		"base/pgsql_tmp/pgsql_tmp123.0":           KindLocal,
		"base/5/t3_16384":                         KindLocal,
		"base/5/t3_16384_fsm.1":                   KindLocal,
		"global/pg_control":                       KindOther,
		"pg_xact/0000":                            KindOther,
		"base/5/PG_VERSION":                       KindOther,
		"postgresql.conf":                         KindOther,
		"base/5/16384":                            KindRel,
		"pg_tblspc/16390/PG_15_202209061/5/16391": KindRel,
	} {
		if got := Classify(p); got != want {
			t.Errorf("Classify(%q) = %v; want %v", p, got, want)
		}
	}
}

func TestSegBlocks(t *testing.T) {
	s := Seg{No: 2}
	if s.FirstBlock() != 2*131072 {
		t.Fatalf("FirstBlock = %d", s.FirstBlock())
	}
	if SegmentBlocks*pg.BlockSize != 1<<30 {
		t.Fatal("segment is not 1 GiB")
	}
}
