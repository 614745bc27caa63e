package postgres

// The generic-WAL part of the consistency workload: contrib's bloom index
// logs its page changes as generic records (page deltas).
func init() {
	workloadSQL = append(workloadSQL,
		"create extension bloom",
		"create table bl (id int, a int, b text)",
		"create index bl_idx on bl using bloom (a, b) with (length = 80, col1 = 2, col2 = 4)",
		"insert into bl select g, g % 1000, md5(g::text) from generate_series(1, 20000) g",
		"delete from bl where id % 3 = 0",
		"vacuum bl",
		"insert into bl select g, g % 10, 'again' from generate_series(20001, 22000) g",
	)
	mustVerify = append(mustVerify, "Generic/Generic")
}
