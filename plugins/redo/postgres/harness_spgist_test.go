package postgres

// The SP-GiST part of the consistency workload. The indexes are created
// before the rows go in: an index build is logged as whole pages, only
// inserts into a built index log SP-GiST records.
func init() {
	workloadSQL = append(workloadSQL,
		// A quad tree of points: leaf tuples are added to chains
		// (ADD_LEAF), a full leaf page has its chain moved to another
		// page (MOVE_LEAFS) or split under a new inner tuple (PICKSPLIT,
		// the root's too). NULLs fill the nulls tree until its root
		// splits too.
		"create table sp (id int, p point)",
		"create index sp_p on sp using spgist (p)",
		"insert into sp select g, point(g % 173, g % 211) from generate_series(1, 6000) g",
		"insert into sp select g, null from generate_series(6001, 7500) g",
		// Vacuum: deleted leaf tuples become dead or placeholders, live
		// ones move down and chains are relinked (VACUUM_LEAF). Whole
		// chains die in the deleted region, and the inserts into it
		// replace their DEAD heads (ADD_LEAF).
		"delete from sp where id % 3 = 0 or p[0] < 30 or (id > 6000 and id % 2 = 0)",
		"vacuum sp",
		"insert into sp select g, point(g % 29, g % 211) from generate_series(7501, 9000) g",
		// Redirects left by the moves become placeholders once their
		// xids are older than every snapshot, and placeholders at the
		// end of a page go (VACUUM_REDIRECT).
		"delete from sp where id % 5 = 0",
		"vacuum sp",
		"vacuum sp",
		// A radix tree of text. Values sharing a prefix give the root
		// inner tuple a prefix; values without it split that prefix, the
		// postfix going to another page (SPLIT_TUPLE). Two characters
		// from a small alphabet, then three from a wide one, make inner
		// tuples grow nodes (ADD_NODE), in place or moved to another
		// page when theirs is full (the parent on the old page or on a
		// third one). Long values go to new leaf pages and are split by
		// repeated suffixing (PICKSPLIT of a new page, with no second
		// page).
		"create table st (id int, t text)",
		"create index st_t on st using spgist (t)",
		"insert into st select g, 'common/' || chr(65 + g % 3) || md5(g::text) from generate_series(1, 500) g",
		"insert into st select g, chr(65 + g % 3) || chr(65 + g / 3 % 3) || '/' || md5(g::text) from generate_series(1, 3000) g",
		"insert into st select g, chr(33 + g * 7 % 90) || chr(33 + g * 13 % 89) || chr(33 + g * 17 % 83) || md5(g::text) from generate_series(501, 12500) g",
		"insert into st select g, repeat(chr(40 + g % 50), 20) || repeat(md5(g::text), 60 + g % 100) from generate_series(12501, 12700) g",
		"insert into st values (0, repeat('x', 12000) || 'a'), (0, repeat('x', 12000) || 'b')",
		// A k-d tree of points, and a range index whose root stays a
		// leaf page; both have nulls. Vacuum of a root leaf page, the
		// normal one's and the nulls one's (VACUUM_ROOT).
		"create table sk (id int, p point)",
		"create index sk_p on sk using spgist (p kd_point_ops)",
		"insert into sk select g, case when g % 100 <> 0 then point(g % 97, g / 97) end from generate_series(1, 3000) g",
		"create table sr (id int, r int4range)",
		"create index sr_r on sr using spgist (r)",
		"insert into sr select g, case when g % 10 <> 0 then int4range(g, g + 10) end from generate_series(1, 50) g",
		"delete from sk where id % 4 = 0",
		"delete from sr where id % 2 = 0",
		"vacuum sk",
		"vacuum sr",
	)
	mustVerify = append(mustVerify, "SPGist/ADD_LEAF", "SPGist/MOVE_LEAFS", "SPGist/ADD_NODE", "SPGist/SPLIT_TUPLE",
		"SPGist/PICKSPLIT", "SPGist/VACUUM_LEAF", "SPGist/VACUUM_ROOT", "SPGist/VACUUM_REDIRECT")
}
