package tpcc

// RollbackSQLState is the SQLSTATE the new-order function raises for an
// unused item id: the 1% of new orders the spec makes roll back.
const RollbackSQLState = "TPC01"

// procDDL creates the five transactions as PL/pgSQL functions, so that each
// transaction is a single statement and a single round trip. The client
// draws every random input (as HammerDB's driver does); the functions do
// only database work.
var procDDL = []string{
	`CREATE OR REPLACE FUNCTION tpcc_neword(p_w_id int, p_d_id int, p_c_id int, p_all_local int,
	    p_i_ids int[], p_supply int[], p_qty int[]) RETURNS numeric AS $$
	DECLARE
	  v_discount numeric; v_last varchar; v_credit char(2);
	  v_w_tax numeric; v_d_tax numeric; v_o_id int;
	  v_cnt int := array_length(p_i_ids, 1);
	  v_price numeric; v_name varchar; v_idata varchar;
	  v_sdata varchar; v_dist char(24); v_amount numeric; v_total numeric := 0;
	BEGIN
	  SELECT c_discount, c_last, c_credit INTO v_discount, v_last, v_credit
	    FROM customer WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_id = p_c_id;
	  SELECT w_tax INTO v_w_tax FROM warehouse WHERE w_id = p_w_id;
	  UPDATE district SET d_next_o_id = d_next_o_id + 1
	    WHERE d_w_id = p_w_id AND d_id = p_d_id
	    RETURNING d_next_o_id - 1, d_tax INTO v_o_id, v_d_tax;
	  INSERT INTO orders (o_id, o_d_id, o_w_id, o_c_id, o_entry_d, o_ol_cnt, o_all_local)
	    VALUES (v_o_id, p_d_id, p_w_id, p_c_id, now(), v_cnt, p_all_local);
	  INSERT INTO new_order (no_o_id, no_d_id, no_w_id) VALUES (v_o_id, p_d_id, p_w_id);
	  FOR i IN 1..v_cnt LOOP
	    SELECT i_price, i_name, i_data INTO v_price, v_name, v_idata FROM item WHERE i_id = p_i_ids[i];
	    IF NOT FOUND THEN
	      RAISE EXCEPTION 'tpcc: item % not found', p_i_ids[i] USING ERRCODE = 'TPC01';
	    END IF;
	    UPDATE stock SET
	      s_quantity = CASE WHEN s_quantity - p_qty[i] >= 10 THEN s_quantity - p_qty[i]
	                        ELSE s_quantity - p_qty[i] + 91 END,
	      s_ytd = s_ytd + p_qty[i], s_order_cnt = s_order_cnt + 1,
	      s_remote_cnt = s_remote_cnt + CASE WHEN p_supply[i] <> p_w_id THEN 1 ELSE 0 END
	    WHERE s_i_id = p_i_ids[i] AND s_w_id = p_supply[i]
	    RETURNING s_data, CASE p_d_id WHEN 1 THEN s_dist_01 WHEN 2 THEN s_dist_02
	      WHEN 3 THEN s_dist_03 WHEN 4 THEN s_dist_04 WHEN 5 THEN s_dist_05
	      WHEN 6 THEN s_dist_06 WHEN 7 THEN s_dist_07 WHEN 8 THEN s_dist_08
	      WHEN 9 THEN s_dist_09 ELSE s_dist_10 END INTO v_sdata, v_dist;
	    v_amount := p_qty[i] * v_price;
	    INSERT INTO order_line (ol_o_id, ol_d_id, ol_w_id, ol_number, ol_i_id,
	        ol_supply_w_id, ol_quantity, ol_amount, ol_dist_info)
	      VALUES (v_o_id, p_d_id, p_w_id, i, p_i_ids[i], p_supply[i], p_qty[i], v_amount, v_dist);
	    v_total := v_total + v_amount;
	  END LOOP;
	  RETURN v_total * (1 - v_discount) * (1 + v_w_tax + v_d_tax);
	END $$ LANGUAGE plpgsql`,

	`CREATE OR REPLACE FUNCTION tpcc_find_customer(p_w_id int, p_d_id int, p_last varchar)
	    RETURNS int AS $$
	DECLARE v_n int; v_c_id int;
	BEGIN
	  SELECT count(*) INTO v_n FROM customer
	    WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_last = p_last;
	  IF v_n = 0 THEN
	    RAISE EXCEPTION 'tpcc: no customer named %', p_last;
	  END IF;
	  SELECT c_id INTO v_c_id FROM customer
	    WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_last = p_last
	    ORDER BY c_first OFFSET (v_n - 1) / 2 LIMIT 1;
	  RETURN v_c_id;
	END $$ LANGUAGE plpgsql`,

	`CREATE OR REPLACE FUNCTION tpcc_payment(p_w_id int, p_d_id int, p_c_w_id int, p_c_d_id int,
	    p_c_id int, p_byname boolean, p_last varchar, p_amount numeric) RETURNS int AS $$
	DECLARE
	  v_w_name varchar; v_d_name varchar; v_c_id int := p_c_id; v_credit char(2);
	BEGIN
	  UPDATE warehouse SET w_ytd = w_ytd + p_amount WHERE w_id = p_w_id RETURNING w_name INTO v_w_name;
	  UPDATE district SET d_ytd = d_ytd + p_amount
	    WHERE d_w_id = p_w_id AND d_id = p_d_id RETURNING d_name INTO v_d_name;
	  IF p_byname THEN
	    v_c_id := tpcc_find_customer(p_c_w_id, p_c_d_id, p_last);
	  END IF;
	  UPDATE customer SET c_balance = c_balance - p_amount,
	      c_ytd_payment = c_ytd_payment + p_amount, c_payment_cnt = c_payment_cnt + 1
	    WHERE c_w_id = p_c_w_id AND c_d_id = p_c_d_id AND c_id = v_c_id
	    RETURNING c_credit INTO v_credit;
	  IF v_credit = 'BC' THEN
	    UPDATE customer SET c_data = substr(format('%s %s %s %s %s %s | ', v_c_id, p_c_d_id,
	        p_c_w_id, p_d_id, p_w_id, p_amount) || c_data, 1, 500)
	      WHERE c_w_id = p_c_w_id AND c_d_id = p_c_d_id AND c_id = v_c_id;
	  END IF;
	  INSERT INTO history (h_c_d_id, h_c_w_id, h_c_id, h_d_id, h_w_id, h_date, h_amount, h_data)
	    VALUES (p_c_d_id, p_c_w_id, v_c_id, p_d_id, p_w_id, now(), p_amount,
	            substr(v_w_name || '    ' || v_d_name, 1, 24));
	  RETURN v_c_id;
	END $$ LANGUAGE plpgsql`,

	`CREATE OR REPLACE FUNCTION tpcc_delivery(p_w_id int, p_carrier int) RETURNS int AS $$
	DECLARE v_o_id int; v_c_id int; v_amount numeric; v_done int := 0;
	BEGIN
	  FOR d IN 1..10 LOOP
	    DELETE FROM new_order WHERE no_w_id = p_w_id AND no_d_id = d AND no_o_id =
	      (SELECT min(no_o_id) FROM new_order WHERE no_w_id = p_w_id AND no_d_id = d)
	      RETURNING no_o_id INTO v_o_id;
	    CONTINUE WHEN NOT FOUND;
	    UPDATE orders SET o_carrier_id = p_carrier
	      WHERE o_w_id = p_w_id AND o_d_id = d AND o_id = v_o_id RETURNING o_c_id INTO v_c_id;
	    UPDATE order_line SET ol_delivery_d = now()
	      WHERE ol_w_id = p_w_id AND ol_d_id = d AND ol_o_id = v_o_id;
	    SELECT sum(ol_amount) INTO v_amount FROM order_line
	      WHERE ol_w_id = p_w_id AND ol_d_id = d AND ol_o_id = v_o_id;
	    UPDATE customer SET c_balance = c_balance + coalesce(v_amount, 0),
	        c_delivery_cnt = c_delivery_cnt + 1
	      WHERE c_w_id = p_w_id AND c_d_id = d AND c_id = v_c_id;
	    v_done := v_done + 1;
	  END LOOP;
	  RETURN v_done;
	END $$ LANGUAGE plpgsql`,

	`CREATE OR REPLACE FUNCTION tpcc_ostat(p_w_id int, p_d_id int, p_c_id int, p_byname boolean,
	    p_last varchar) RETURNS int AS $$
	DECLARE
	  v_c_id int := p_c_id; v_balance numeric; v_first varchar; v_middle char(2);
	  v_clast varchar; v_o_id int; v_carrier int; v_entry timestamp; v_lines int := 0; r record;
	BEGIN
	  IF p_byname THEN
	    v_c_id := tpcc_find_customer(p_w_id, p_d_id, p_last);
	  END IF;
	  SELECT c_balance, c_first, c_middle, c_last INTO v_balance, v_first, v_middle, v_clast
	    FROM customer WHERE c_w_id = p_w_id AND c_d_id = p_d_id AND c_id = v_c_id;
	  SELECT o_id, o_carrier_id, o_entry_d INTO v_o_id, v_carrier, v_entry FROM orders
	    WHERE o_w_id = p_w_id AND o_d_id = p_d_id AND o_c_id = v_c_id ORDER BY o_id DESC LIMIT 1;
	  FOR r IN SELECT ol_i_id, ol_supply_w_id, ol_quantity, ol_amount, ol_delivery_d
	      FROM order_line WHERE ol_w_id = p_w_id AND ol_d_id = p_d_id AND ol_o_id = v_o_id LOOP
	    v_lines := v_lines + 1;
	  END LOOP;
	  RETURN v_lines;
	END $$ LANGUAGE plpgsql`,

	`CREATE OR REPLACE FUNCTION tpcc_slev(p_w_id int, p_d_id int, p_threshold int) RETURNS int AS $$
	DECLARE v_next int; v_count int;
	BEGIN
	  SELECT d_next_o_id INTO v_next FROM district WHERE d_w_id = p_w_id AND d_id = p_d_id;
	  SELECT count(DISTINCT s_i_id) INTO v_count FROM order_line, stock
	    WHERE ol_w_id = p_w_id AND ol_d_id = p_d_id AND ol_o_id < v_next AND ol_o_id >= v_next - 20
	      AND s_w_id = p_w_id AND s_i_id = ol_i_id AND s_quantity < p_threshold;
	  RETURN v_count;
	END $$ LANGUAGE plpgsql`,
}
