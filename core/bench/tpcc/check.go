package tpcc

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Check is one TPC-C consistency condition (spec clause 3.3.2) and the
// number of warehouses or districts that violate it.
type Check struct {
	Name       string
	Violations int64
}

// checks are queries that count violating warehouses/districts.
var checks = []struct{ name, sql string }{
	{"1: w_ytd = sum(d_ytd)", `SELECT count(*) FROM warehouse w
		WHERE w.w_ytd <> (SELECT sum(d_ytd) FROM district d WHERE d.d_w_id = w.w_id)`},
	{"2: d_next_o_id - 1 = max(o_id) = max(no_o_id)", `SELECT count(*) FROM district d
		WHERE d.d_next_o_id - 1 <> (SELECT max(o_id) FROM orders o WHERE o.o_w_id = d.d_w_id AND o.o_d_id = d.d_id)
		   OR d.d_next_o_id - 1 <> coalesce((SELECT max(no_o_id) FROM new_order n
		        WHERE n.no_w_id = d.d_w_id AND n.no_d_id = d.d_id), d.d_next_o_id - 1)`},
	{"3: max(no_o_id) - min(no_o_id) + 1 = count(new_order)", `SELECT count(*) FROM
		(SELECT max(no_o_id) - min(no_o_id) + 1 AS span, count(*) AS n FROM new_order
		 GROUP BY no_w_id, no_d_id) s WHERE span <> n`},
	{"4: sum(o_ol_cnt) = count(order_line)", `SELECT count(*) FROM
		(SELECT o_w_id, o_d_id, sum(o_ol_cnt) AS n FROM orders GROUP BY o_w_id, o_d_id) o
		JOIN (SELECT ol_w_id, ol_d_id, count(*) AS n FROM order_line GROUP BY ol_w_id, ol_d_id) l
		  ON l.ol_w_id = o.o_w_id AND l.ol_d_id = o.o_d_id WHERE o.n <> l.n`},
	{"5: o_carrier_id is null exactly for orders in new_order", `SELECT count(*) FROM orders o
		WHERE (o.o_carrier_id IS NULL) <> EXISTS (SELECT 1 FROM new_order n
		  WHERE n.no_w_id = o.o_w_id AND n.no_d_id = o.o_d_id AND n.no_o_id = o.o_id)`},
	{"6: o_ol_cnt = count of its order lines", `SELECT count(*) FROM orders o
		WHERE o.o_ol_cnt <> (SELECT count(*) FROM order_line l
		  WHERE l.ol_w_id = o.o_w_id AND l.ol_d_id = o.o_d_id AND l.ol_o_id = o.o_id)`},
	{"7: d_ytd = sum(h_amount) per district", `SELECT count(*) FROM district d
		WHERE d.d_ytd <> (SELECT sum(h_amount) FROM history h WHERE h.h_w_id = d.d_w_id AND h.h_d_id = d.d_id)`},
}

// Verify runs the consistency checks on a TPC-C database and returns each
// check's result; ok is true when no check found a violation.
func Verify(ctx context.Context, c *pgx.Conn) (results []Check, ok bool, err error) {
	ok = true
	for _, ch := range checks {
		var n int64
		if err := c.QueryRow(ctx, ch.sql).Scan(&n); err != nil {
			return results, false, fmt.Errorf("tpcc: check %s: %w", ch.name, err)
		}
		results = append(results, Check{Name: ch.name, Violations: n})
		if n != 0 {
			ok = false
		}
	}
	return results, ok, nil
}
