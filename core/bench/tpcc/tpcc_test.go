package tpcc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"
	"github.com/stratadb/strata/internal/pgtest"
)

func TestPickMix(t *testing.T) {
	var n [numTx]int
	for i := 1; i <= 23; i++ {
		n[Pick(i)]++
	}
	want := [numTx]int{10, 10, 1, 1, 1}
	if n != want {
		t.Fatalf("mix = %v, want %v", n, want)
	}
}

func TestNURandRange(t *testing.T) {
	g := NewRand(1, RunConstants)
	seen := map[int]int{}
	for i := 0; i < 200000; i++ {
		v := g.NURand(255, 0, 999)
		if v < 0 || v > 999 {
			t.Fatalf("NURand out of range: %d", v)
		}
		seen[v]++
		if id := g.ItemID(); id < 1 || id > Items {
			t.Fatalf("item id out of range: %d", id)
		}
	}
	// NURand is skewed: the most frequent value is drawn far more often
	// than under a uniform draw (200 per value).
	max := 0
	for _, c := range seen {
		if c > max {
			max = c
		}
	}
	if max < 600 {
		t.Fatalf("NURand looks uniform: max count %d", max)
	}
	if LastName(371) != "PRICALLYOUGHT" {
		t.Fatalf("LastName(371) = %s", LastName(371))
	}
}

// TestLoadRunVerify loads one warehouse into a real Postgres 15, clones it,
// runs all five transactions for a few seconds and checks consistency.
func TestLoadRunVerify(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	ctx := context.Background()
	base := srv.ConnString("postgres")
	log := zerolog.New(zerolog.NewTestWriter(t))
	if err := Load(ctx, LoadOptions{Base: base, DB: "tpcc_tmpl", Warehouses: 1, Workers: 2, Log: log, Seed: 42}); err != nil {
		t.Fatal(err)
	}
	ok, err := DatabaseExists(ctx, base, "tpcc_tmpl", 1)
	if err != nil || !ok {
		t.Fatalf("DatabaseExists = %v, %v", ok, err)
	}
	c, err := Connect(ctx, base, "tpcc_tmpl")
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	for _, tb := range Tables {
		var n int64
		if err := c.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{tb}.Sanitize()).Scan(&n); err != nil {
			t.Fatal(err)
		}
		counts[tb] = n
	}
	c.Close(ctx)
	want := map[string]int64{"warehouse": 1, "district": 10, "customer": 30000, "history": 30000,
		"new_order": 9000, "orders": 30000, "item": 100000, "stock": 100000}
	for k, v := range want {
		if counts[k] != v {
			t.Errorf("%s: %d rows, want %d", k, counts[k], v)
		}
	}
	if ol := counts["order_line"]; ol < 30000*5 || ol > 30000*15 {
		t.Errorf("order_line: %d rows", ol)
	}

	const vus = 3
	if err := Clone(ctx, base, "tpcc_tmpl", "tpcc", nil); err != nil {
		t.Fatal(err)
	}
	res, err := Run(ctx, Options{Base: base, DB: "tpcc", Warehouses: 1, VUs: vus,
		Rampup: time.Second, Duration: 5 * time.Second, Seed: 7, Log: log, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NOPM %.0f TPM %.0f new orders %d rollbacks %d counts %v errors %v", res.NOPM, res.TPM, res.NewOrders, res.Rollbacks, res.Count, res.Errors)
	if res.NewOrders <= 0 || res.NOPM <= 0 || res.TPM < res.NOPM {
		t.Fatalf("implausible result: %+v", res)
	}
	for _, n := range TxNames {
		if res.Errors[n] != 0 {
			t.Errorf("%d %s errors", res.Errors[n], n)
		}
	}
	if res.Count["new_order"] == 0 || res.Count["payment"] == 0 {
		t.Errorf("counts %v", res.Count)
	}
	// The driver's own new-order count (minus rollbacks) matches the
	// database's, within the transactions at the window edges: the
	// database count is the d_next_o_id delta between two snapshots taken
	// while the virtual users run, so at each edge the users' transactions
	// in flight and those that commit while the snapshot query runs can
	// fall on the other side (a CI run saw the database 4 ahead with 3
	// users). How many depends on how long the snapshot queries take: on
	// a machine loaded far beyond CI (go test -p 4 on two cores) the
	// database was 10 ahead of 759. The bound is three per user or 3% of
	// the window's new orders, whichever is more; a counting error (a
	// transaction counted twice or never) would be off by far more.
	tol := max(3*vus, res.NewOrders*3/100)
	if d := res.Count["new_order"] - res.Rollbacks - res.NewOrders; d < -tol || d > tol {
		t.Errorf("driver counted %d committed new orders, database %d (tolerance %d)", res.Count["new_order"]-res.Rollbacks, res.NewOrders, tol)
	}
	if p := res.Latency["new_order"].ValueAtQuantile(95); p <= 0 {
		t.Errorf("p95 = %d", p)
	}
	c, err = Connect(ctx, base, "tpcc")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// Every transaction type, run directly (the mix may draw the rare
	// ones seldom on a starved machine), works and keeps consistency.
	v := &vu{home: 1, g: NewRand(99, RunConstants)}
	for tx := Tx(0); tx < numTx; tx++ {
		for i := 0; i < 20; i++ {
			if _, err := v.exec(ctx, c, tx, 1); err != nil {
				t.Fatalf("%s: %v", tx, err)
			}
		}
	}
	var delivered int
	if err := c.QueryRow(ctx, "SELECT count(*) FROM orders WHERE o_carrier_id IS NOT NULL AND o_id > 2100").Scan(&delivered); err != nil || delivered == 0 {
		t.Fatalf("delivery delivered nothing: %d %v", delivered, err)
	}
	checks, ok, err := Verify(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("consistency: %+v", checks)
	}
	// Break consistency and make sure the checks notice.
	if _, err := c.Exec(ctx, "UPDATE district SET d_next_o_id = d_next_o_id + 1 WHERE d_id = 3"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := Verify(ctx, c); ok {
		t.Fatal("Verify did not notice a broken d_next_o_id")
	}
}

// TestCloneWaitsForTemplateSessions: a session on the template (as the
// autoprewarm worker holds one right after a start) makes CREATE DATABASE
// fail after its own 5 s; Clone waits for the session to leave and then
// clones, and one that never leaves gives an error naming it.
func TestCloneWaitsForTemplateSessions(t *testing.T) {
	srv := pgtest.Start(t, pgtest.Options{})
	ctx := context.Background()
	base := srv.ConnString("postgres")
	admin, err := Connect(ctx, base, "")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE tmpl"); err != nil {
		t.Fatal(err)
	}
	hold := func() *pgx.Conn {
		c, err := pgx.Connect(ctx, srv.ConnString("tmpl")+"&application_name=holder")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	// A session that leaves after 7 s: past CREATE DATABASE's own wait.
	c := hold()
	go func() { time.Sleep(7 * time.Second); c.Close(ctx) }()
	var heard []string
	t0 := time.Now()
	if err := Clone(ctx, base, "tmpl", "run", func(h string) { heard = append(heard, h) }); err != nil {
		t.Fatalf("clone after the session left: %v", err)
	}
	if len(heard) != 1 || !strings.Contains(heard[0], "client holder pid") {
		t.Fatalf("waiting heard %q, want one report naming the holder", heard)
	}
	t.Logf("cloned after %s; waiting heard %q", time.Since(t0).Round(time.Millisecond), heard[0])

	// A session that stays: the error names it.
	c = hold()
	defer c.Close(ctx)
	old := CloneWait
	CloneWait = time.Second
	defer func() { CloneWait = old }()
	err = Clone(ctx, base, "tmpl", "run", nil)
	if err == nil || !strings.Contains(err.Error(), "client holder pid") || !strings.Contains(err.Error(), "55006") {
		t.Fatalf("clone with a session that stays: %v", err)
	}
}
