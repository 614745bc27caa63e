// Package e2e holds the pageserver's end-to-end acceptance tests (issue 5):
// a real PostgreSQL 15, three real safekeepers (in process) streaming from
// it with synchronous replication to ANY 2 of them, and the pageserver
// service (core/pageserver/service, what `strata pageserver` runs) bound to
// them, in process or as a separate process that the tests kill -9.
//
//   - TestFPIIngestAndBranch (and TestPushdownIngest): fpi image policy, Postgres on local disk with
//     full_page_writes=on, pgbench; pages equal Postgres' data files
//     (masked); a branch before a DELETE FROM, its basebackup started as a
//     stock Postgres, shows the deleted rows.
//   - TestWritebackFUSE: writeback, Postgres on a FUSE PGDATA over the
//     pageserver, the commit LSN from the safekeepers; pages equal.
//   - TestKillPageserverDuringIngest: kill -9 of a pageserver process
//     during ingest with a faulty object store; every page at every
//     durable LSN survives, also on an empty local disk.
//
// The package has no non-test code.
package e2e
