// Package tpcc is a TPROC-C workload for PostgreSQL, written from the TPC-C
// specification and HammerDB's documentation (not from HammerDB's code): the
// nine tables with HammerDB's keys and secondary indexes, a parallel loader,
// the five transactions as server-side PL/pgSQL functions (one round trip
// each), a driver of virtual users with the HammerDB mix and no keying or
// thinking time, NOPM/TPM counted the HammerDB way, and the TPC-C
// consistency checks.
//
// It is not a TPC-C benchmark in the audited sense (no terminals, no
// think times, no response-time constraints per transaction type), exactly
// like HammerDB's TPROC-C.
package tpcc

// Row counts of the TPC-C schema.
const (
	Items                = 100000
	StockPerWarehouse    = 100000
	DistrictsPerWH       = 10
	CustomersPerDistrict = 3000
	OrdersPerDistrict    = 3000
	// NewOrdersPerDistrict is the number of undelivered orders loaded per
	// district: orders 2101..3000.
	NewOrdersPerDistrict = 900
)

// tableDDL creates the nine tables without keys; keys and indexes come after
// loading (indexDDL), as a bulk loader should.
var tableDDL = []string{
	`CREATE TABLE warehouse (
		w_id smallint NOT NULL, w_ytd numeric(12,2), w_tax numeric(4,4),
		w_name varchar(10), w_street_1 varchar(20), w_street_2 varchar(20),
		w_city varchar(20), w_state char(2), w_zip char(9))`,
	`CREATE TABLE district (
		d_id smallint NOT NULL, d_w_id smallint NOT NULL, d_ytd numeric(12,2),
		d_tax numeric(4,4), d_next_o_id integer, d_name varchar(10),
		d_street_1 varchar(20), d_street_2 varchar(20), d_city varchar(20),
		d_state char(2), d_zip char(9))`,
	`CREATE TABLE customer (
		c_id integer NOT NULL, c_d_id smallint NOT NULL, c_w_id smallint NOT NULL,
		c_first varchar(16), c_middle char(2), c_last varchar(16),
		c_street_1 varchar(20), c_street_2 varchar(20), c_city varchar(20),
		c_state char(2), c_zip char(9), c_phone char(16), c_since timestamp,
		c_credit char(2), c_credit_lim numeric(12,2), c_discount numeric(4,4),
		c_balance numeric(12,2), c_ytd_payment numeric(12,2),
		c_payment_cnt integer, c_delivery_cnt integer, c_data varchar(500))`,
	`CREATE TABLE history (
		h_c_id integer, h_c_d_id smallint, h_c_w_id smallint, h_d_id smallint,
		h_w_id smallint, h_date timestamp, h_amount numeric(6,2), h_data varchar(24))`,
	`CREATE TABLE new_order (
		no_w_id smallint NOT NULL, no_d_id smallint NOT NULL, no_o_id integer NOT NULL)`,
	`CREATE TABLE orders (
		o_id integer NOT NULL, o_w_id smallint NOT NULL, o_d_id smallint NOT NULL,
		o_c_id integer, o_carrier_id smallint, o_ol_cnt smallint,
		o_all_local smallint, o_entry_d timestamp)`,
	`CREATE TABLE order_line (
		ol_w_id smallint NOT NULL, ol_d_id smallint NOT NULL, ol_o_id integer NOT NULL,
		ol_number smallint NOT NULL, ol_i_id integer, ol_delivery_d timestamp,
		ol_amount numeric(6,2), ol_supply_w_id smallint, ol_quantity smallint,
		ol_dist_info char(24))`,
	`CREATE TABLE item (
		i_id integer NOT NULL, i_im_id integer, i_name varchar(24),
		i_price numeric(5,2), i_data varchar(50))`,
	`CREATE TABLE stock (
		s_i_id integer NOT NULL, s_w_id smallint NOT NULL, s_quantity smallint,
		s_dist_01 char(24), s_dist_02 char(24), s_dist_03 char(24),
		s_dist_04 char(24), s_dist_05 char(24), s_dist_06 char(24),
		s_dist_07 char(24), s_dist_08 char(24), s_dist_09 char(24),
		s_dist_10 char(24), s_ytd integer, s_order_cnt smallint,
		s_remote_cnt smallint, s_data varchar(50))`,
}

// indexDDL holds HammerDB's primary keys and its two secondary indexes:
// customer (c_w_id, c_d_id, c_last, c_first, c_id) and
// orders (o_w_id, o_d_id, o_c_id, o_id). Each statement can run in parallel
// with the others.
var indexDDL = []string{
	`ALTER TABLE warehouse ADD CONSTRAINT warehouse_i1 PRIMARY KEY (w_id)`,
	`ALTER TABLE district ADD CONSTRAINT district_i1 PRIMARY KEY (d_w_id, d_id)`,
	`ALTER TABLE customer ADD CONSTRAINT customer_i1 PRIMARY KEY (c_w_id, c_d_id, c_id)`,
	`CREATE UNIQUE INDEX customer_i2 ON customer (c_w_id, c_d_id, c_last, c_first, c_id)`,
	`ALTER TABLE new_order ADD CONSTRAINT new_order_i1 PRIMARY KEY (no_w_id, no_d_id, no_o_id)`,
	`ALTER TABLE orders ADD CONSTRAINT orders_i1 PRIMARY KEY (o_w_id, o_d_id, o_id)`,
	`CREATE UNIQUE INDEX orders_i2 ON orders (o_w_id, o_d_id, o_c_id, o_id)`,
	`ALTER TABLE order_line ADD CONSTRAINT order_line_i1 PRIMARY KEY (ol_w_id, ol_d_id, ol_o_id, ol_number)`,
	`ALTER TABLE item ADD CONSTRAINT item_i1 PRIMARY KEY (i_id)`,
	`ALTER TABLE stock ADD CONSTRAINT stock_i1 PRIMARY KEY (s_w_id, s_i_id)`,
}

// Tables lists the nine TPC-C tables.
var Tables = []string{"warehouse", "district", "customer", "history", "new_order", "orders", "order_line", "item", "stock"}
