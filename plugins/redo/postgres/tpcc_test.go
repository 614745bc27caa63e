package postgres

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stratadb/strata/internal/pgtest"
)

// A TPC-C-like schema and transactions (new order, payment, delivery,
// stock level), small enough for a unit test; the strata bench package has
// the real TPROC-C.
var tpccSchema = []string{
	`create table warehouse (w_id int primary key, w_name text, w_ytd numeric(12,2))`,
	`create table district (d_w_id int, d_id int, d_name text, d_ytd numeric(12,2), d_next_o_id int, primary key (d_w_id, d_id))`,
	`create table customer (c_w_id int, c_d_id int, c_id int, c_last text, c_balance numeric(12,2), c_ytd_payment numeric(12,2),
		c_payment_cnt int, c_delivery_cnt int, c_data text, primary key (c_w_id, c_d_id, c_id))`,
	`create index customer_last on customer (c_w_id, c_d_id, c_last)`,
	`create table history (h_c_id int, h_d_id int, h_w_id int, h_date timestamp, h_amount numeric(6,2))`,
	`create table item (i_id int primary key, i_name text, i_price numeric(5,2))`,
	`create table stock (s_w_id int, s_i_id int, s_quantity int, s_ytd int, s_order_cnt int, s_data text, primary key (s_w_id, s_i_id))`,
	`create table orders (o_w_id int, o_d_id int, o_id int, o_c_id int, o_entry_d timestamp, o_carrier_id int, o_ol_cnt int,
		primary key (o_w_id, o_d_id, o_id))`,
	`create index orders_cust on orders (o_w_id, o_d_id, o_c_id, o_id)`,
	`create table new_order (no_w_id int, no_d_id int, no_o_id int, primary key (no_w_id, no_d_id, no_o_id))`,
	`create table order_line (ol_w_id int, ol_d_id int, ol_o_id int, ol_number int, ol_i_id int, ol_quantity int,
		ol_amount numeric(6,2), ol_delivery_d timestamp, primary key (ol_w_id, ol_d_id, ol_o_id, ol_number))`,
	`insert into warehouse select w, 'w' || w, 0 from generate_series(1, 2) w`,
	`insert into district select w, d, 'd' || d, 0, 1 from generate_series(1, 2) w, generate_series(1, 10) d`,
	`insert into customer select w, d, c, 'last' || (c % 17), 0, 0, 0, 0, repeat('c', 200)
		from generate_series(1, 2) w, generate_series(1, 10) d, generate_series(1, 60) c`,
	`insert into item select i, 'item' || i, (i % 100) + 1 from generate_series(1, 1000) i`,
	`insert into stock select w, i, 50, 0, 0, repeat('s', 50) from generate_series(1, 2) w, generate_series(1, 1000) i`,
	`create function new_order(w int, d int, c int, n int) returns void language plpgsql as $$
	declare o int; i int;
	begin
		update district set d_next_o_id = d_next_o_id + 1 where d_w_id = w and d_id = d returning d_next_o_id - 1 into o;
		insert into orders values (w, d, o, c, now(), null, n);
		insert into new_order values (w, d, o);
		for k in 1..n loop
			i := 1 + (random() * 999)::int;
			update stock set s_quantity = case when s_quantity > 10 then s_quantity - 5 else s_quantity + 86 end,
				s_ytd = s_ytd + 5, s_order_cnt = s_order_cnt + 1 where s_w_id = w and s_i_id = i;
			insert into order_line values (w, d, o, k, i, 5, 5 * (select i_price from item where i_id = i), null);
		end loop;
	end $$`,
	`create function payment(w int, d int, c int, amount numeric) returns void language plpgsql as $$
	begin
		update warehouse set w_ytd = w_ytd + amount where w_id = w;
		update district set d_ytd = d_ytd + amount where d_w_id = w and d_id = d;
		update customer set c_balance = c_balance - amount, c_ytd_payment = c_ytd_payment + amount,
			c_payment_cnt = c_payment_cnt + 1 where c_w_id = w and c_d_id = d and c_id = c;
		insert into history values (c, d, w, now(), amount);
	end $$`,
	`create function delivery(w int, carrier int) returns void language plpgsql as $$
	declare o int; c int;
	begin
		for d in 1..10 loop
			select min(no_o_id) into o from new_order where no_w_id = w and no_d_id = d;
			continue when o is null;
			delete from new_order where no_w_id = w and no_d_id = d and no_o_id = o;
			update orders set o_carrier_id = carrier where o_w_id = w and o_d_id = d and o_id = o returning o_c_id into c;
			update order_line set ol_delivery_d = now() where ol_w_id = w and ol_d_id = d and ol_o_id = o;
			update customer set c_balance = c_balance + 1, c_delivery_cnt = c_delivery_cnt + 1
				where c_w_id = w and c_d_id = d and c_id = c;
		end loop;
	end $$`,
}

const tpccScript = `\set w random(1, 2)
\set d random(1, 10)
\set c random(1, 60)
\set n random(5, 15)
\set r random(1, 100)
select case when :r <= 45 then new_order(:w, :d, :c, :n)::text
            when :r <= 88 then payment(:w, :d, :c, 10.5)::text
            when :r <= 92 then delivery(:w, 1 + :r % 10)::text
            else (select count(*) from stock where s_w_id = :w and s_quantity < 20)::text end;
`

// runTPCC loads the schema and runs txns transactions on each of 2
// clients (2*txns in all).
func runTPCC(t testing.TB, s *pgtest.Server, txns int) error {
	for _, q := range tpccSchema {
		s.Exec("postgres", q)
	}
	dir := pgtest.MkdirOwned(t, "strata-tpcc-")
	script := filepath.Join(dir, "tpcc.sql")
	if err := os.WriteFile(script, []byte(tpccScript), 0o644); err != nil {
		return err
	}
	if out, err := s.Pgbench("-n", "-c", "2", "-t", strconv.Itoa(txns), "-f", script, "postgres"); err != nil {
		return fmt.Errorf("%v\n%s", err, out)
	}
	return nil
}
