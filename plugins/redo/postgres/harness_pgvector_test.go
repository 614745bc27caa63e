package postgres

import "os"

// The pgvector part of the consistency workload, run only where pgvector
// is installed (it is not a Debian bookworm package, so CI does not have
// it): its hnsw and ivfflat indexes log through generic WAL.
func init() {
	if _, err := os.Stat("/usr/share/postgresql/15/extension/vector.control"); err != nil {
		return
	}
	workloadSQL = append(workloadSQL,
		"create extension vector",
		"create table vec (id int, v vector(3))",
		"create index vec_hnsw on vec using hnsw (v vector_l2_ops) with (m = 4, ef_construction = 16)",
		"insert into vec select g, ('[' || g % 100 || ',' || g % 37 || ',' || g % 11 || ']')::vector from generate_series(1, 3000) g",
		"create index vec_ivf on vec using ivfflat (v vector_l2_ops) with (lists = 10)",
		"insert into vec select g, ('[' || g % 90 || ',' || g % 31 || ',' || g % 13 || ']')::vector from generate_series(3001, 4500) g",
		"delete from vec where id % 3 = 0",
		"vacuum vec",
		"insert into vec select g, ('[' || g % 7 || ',' || g % 5 || ',' || g % 3 || ']')::vector from generate_series(4501, 5000) g",
	)
}
