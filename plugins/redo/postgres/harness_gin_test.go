package postgres

// The GIN part of the consistency workload.
func init() {
	workloadSQL = append(workloadSQL,
		// GIN without the pending list: one key in every row grows a
		// posting tree (created, its leaves recompressed and split, its
		// root split, downlinks added to the internal page); two thousand
		// keys of ten rows each fill and split entry pages, their posting
		// lists replaced in place as they grow.
		"create table gn (id int, a int[])",
		"create index gn_a on gn using gin (a) with (fastupdate = off)",
		"insert into gn select g, array[0, g % 2000] from generate_series(1, 20000) g",
		// Vacuum: entry pages lose items (logged as images), posting-tree
		// leaves are recompressed, and the emptied ones are deleted.
		"delete from gn where id between 1000 and 19000",
		"vacuum gn",
		"insert into gn select g, array[0, g % 300] from generate_series(20001, 22000) g",
		// Keys of 800 bytes: a few per page, so that internal entry pages
		// split too (the split of a child completed in the same record).
		"create table gw (id int, a text[])",
		"create index gw_a on gw using gin (a) with (fastupdate = off)",
		"insert into gw select g, array[(select string_agg(md5((g * 31 % 500)::text || i::text), '') from generate_series(1, 25) i)] from generate_series(1, 500) g",
		// The pending list (fastupdate): rows go to list pages (the tail
		// page's tuples added, new sublists linked), a big row needs a
		// sublist of several pages, and cleanup moves the list into the
		// tree and deletes its pages.
		"create table gp (id int, t tsvector)",
		"create index gp_t on gp using gin (t) with (fastupdate = on, gin_pending_list_limit = 64)",
		"insert into gp select g, to_tsvector('simple', 'w' || (g % 100) || ' x' || (g % 7) || ' common') from generate_series(1, 3000) g",
		"insert into gp select 0, to_tsvector('simple', (select string_agg('k' || i, ' ') from generate_series(1, 3000) i))",
		"select gin_clean_pending_list('gp_t')",
		"insert into gp select g, to_tsvector('simple', 'late' || (g % 10)) from generate_series(3001, 3300) g",
		"vacuum gp",
	)
	mustVerify = append(mustVerify, "Gin/CREATE_PTREE", "Gin/INSERT", "Gin/SPLIT", "Gin/VACUUM_DATA_LEAF_PAGE",
		"Gin/DELETE_PAGE", "Gin/UPDATE_META_PAGE", "Gin/INSERT_LISTPAGE", "Gin/DELETE_LISTPAGE")
}
