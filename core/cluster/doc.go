// Package cluster runs a whole strata cluster on one machine: the embedded
// default behind `strata up`, `strata down` and `strata status`. It starts
// the safekeepers as background `strata safekeeper` processes and Postgres
// through core/postgres, records what it started in <data_dir>/cluster.json,
// and stops exactly those processes again.
//
// It is an orchestrator for one machine, not a control plane: it has no
// notion of hosts, and it restarts nothing by itself.
package cluster
