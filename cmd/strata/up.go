package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/cluster"
)

func (a *app) cluster() (*cluster.Cluster, error) {
	cfg, err := a.load()
	if err != nil {
		return nil, err
	}
	log, err := a.logger(cfg, "cluster")
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	return cluster.New(cfg, self, log)
}

func progressLine(s string) { fmt.Fprintln(os.Stderr, "strata:", s) }

func newUpCmd(a *app) *cobra.Command {
	var importDir string
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start the whole cluster on this machine and print its connection string",
		Long: `Start the cluster that the config describes on this machine (the embedded
default: three safekeepers, a pageserver, and the compute agent running Postgres 15
on a FUSE data directory served by the pageserver, with its WAL acknowledged by any
two of the safekeepers; state under ./.strata), wait until Postgres accepts
connections and a quorum of safekeepers streams from it, print the postgres://
connection string on a line of its own on standard output, and return. The cluster
runs in the background until 'strata down'. Running 'strata up' again on a running
cluster prints the string again. Needs root (the FUSE mount).

With --import DIR a new cluster starts from DIR instead of initdb: a stopped
PostgreSQL 15 data directory, such as a copy that 'strata restore' wrote (a
new cluster from an earlier moment of another) or any cleanly stopped
server's folder (moving a database onto strata). DIR is only read. The new
cluster needs a cluster.data_dir of its own; it may share the object store
of the cluster DIR came from (it gets a system identifier of its own, under
which its WAL is archived). Its superuser gets the new cluster's password;
the roles and data are DIR's. A cluster that holds data already refuses
--import; after the first start, start it without --import.`,
		Example: `  strata up
  strata restore --at "2026-12-06 13:40:00" --to /var/lib/strata-restore
  STRATA_CLUSTER_DATA_DIR=/var/lib/strata-b STRATA_COMPUTE_PORT=26432 \
    STRATA_CLUSTER_SAFEKEEPER_PORT=8676 STRATA_CLUSTER_METRICS_PORT=10676 \
    strata up --import /var/lib/strata-restore`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.cluster()
			if err != nil {
				return err
			}
			up := c.Up
			if importDir != "" {
				up = func(ctx context.Context, progress func(string)) (string, error) {
					return c.Import(ctx, importDir, progress)
				}
			}
			url, err := up(cmd.Context(), progressLine)
			if err != nil {
				return err
			}
			fmt.Println(url)
			return nil
		},
	}
	cmd.Flags().StringVar(&importDir, "import", "", "a new cluster: start from this stopped PostgreSQL 15 data directory (read only) instead of initdb")
	return cmd
}

func newDownCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Stop the cluster that 'strata up' started: compute, pageserver, safekeepers (the data stays)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.cluster()
			if err != nil {
				return err
			}
			return c.Down(cmd.Context(), progressLine)
		},
	}
}

func newStatusCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show each process of the cluster, its LSNs and lags, and the disk it takes",
		Long: `Show each process of the cluster, its LSNs and lags, and the disk it takes,
and how far the WAL in the object store reaches (what a restore from the
store alone gets back were the machine lost now).

Exits 0 when every process of the cluster runs. Exits 1 when the cluster is
not running (it still shows the disk its state takes) or when a process of
it has died (it names each, with the PID it had; strata up starts the
cluster again).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.cluster()
			if err != nil {
				return err
			}
			st, err := c.Status(cmd.Context())
			if errors.Is(err, cluster.ErrNotRunning) {
				// A stopped cluster still takes disk: say how much.
				c.DiskStatus().PrintDisk(os.Stdout)
			}
			if err != nil {
				return err
			}
			st.Print(os.Stdout)
			if dead := st.NotRunning(); len(dead) > 0 {
				return fmt.Errorf("not running: %s; strata up starts the cluster again", strings.Join(dead, ", "))
			}
			return nil
		},
	}
}
