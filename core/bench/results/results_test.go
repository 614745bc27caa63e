package results

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/stratadb/strata/internal/pgtest"
)

func sample(label string) *Run {
	return &Run{Matrix: "m", Label: label, Series: "stock", Target: "stock", TargetKind: "stock",
		Workload: "tpcc", Repeat: 1, VUs: 4, Warehouses: 2,
		Settings: map[string]string{"full_page_writes": "on"}, Machine: map[string]string{"cores": "2"},
		GitRev: "abc", StartedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), WindowSec: 10,
		Status: "ok", NOPM: 1234.5, TPM: 3000, P95: 7.5, Notes: []string{"cpu noise"},
		Metrics:    map[string]float64{"wal_bytes_per_new_order": 15000},
		Latency:    []Latency{{Tx: "new_order", Count: 10, P50: 1, P95: 7.5, P99: 9, Max: 12, Mean: 2}},
		Waits:      map[string]int64{"CPU": 40, "IO:WALSync": 9},
		TimeSeries: map[string][]Point{"nopm": {{T: 5, V: 1200}, {T: 10, V: 1260}}},
	}
}

func roundTrip(t *testing.T, dsn string) {
	ctx := context.Background()
	s, err := Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	a, b := sample("a"), sample("b")
	b.Matrix = "other"
	for _, r := range []*Run{a, b} {
		if err := s.Save(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	// A second open (a second invocation) sees both runs.
	s, err = Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all, err := s.List(ctx, Filter{})
	if err != nil || len(all) != 2 || all[0].Label != "a" || all[1].Label != "b" {
		t.Fatalf("list = %+v, %v", all, err)
	}
	m, _ := s.List(ctx, Filter{Matrix: "other"})
	if len(m) != 1 || m[0].ID != b.ID {
		t.Fatalf("filtered list = %+v", m)
	}
	last, _ := s.List(ctx, Filter{Limit: 1})
	if len(last) != 1 || last[0].ID != b.ID {
		t.Fatalf("limit list = %+v", last)
	}
	got, err := s.Get(ctx, a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, a) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, a)
	}
	if _, err := s.Get(ctx, 999); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing run: %v", err)
	}
}

func TestSQLite(t *testing.T) {
	roundTrip(t, filepath.Join(t.TempDir(), "sub", "results.db"))
}

func TestPostgres(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	roundTrip(t, srv.ConnString("postgres"))
}
