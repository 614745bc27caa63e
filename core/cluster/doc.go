// Package cluster runs a whole strata cluster on one machine: the embedded
// default behind `strata up`, `strata down` and `strata status`. It starts
// three safekeepers, the pageserver and the compute agent as background
// `strata safekeeper`, `strata pageserver` and `strata compute` processes
// (the agent mounts PGDATA as FUSE over the pageserver and runs Postgres on
// it), records what it started in <data_dir>/cluster.json, and stops exactly
// those processes again, in reverse order.
//
// It is an orchestrator for one machine, not a control plane: it has no
// notion of hosts, and it restarts nothing by itself (the compute agent
// restarts Postgres).
package cluster
