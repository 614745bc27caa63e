package main

import (
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
	return &cobra.Command{
		Use:   "up",
		Short: "Start the whole cluster on this machine and print its connection string",
		Long: `Start the cluster that the config describes on this machine (the embedded
default: three safekeepers, a pageserver, and the compute agent running Postgres 15
on a FUSE data directory served by the pageserver, with its WAL acknowledged by any
two of the safekeepers; state under ./.strata), wait until Postgres accepts
connections and a quorum of safekeepers streams from it, print the postgres://
connection string on a line of its own on standard output, and return. The cluster
runs in the background until 'strata down'. Running 'strata up' again on a running
cluster prints the string again. Needs root (the FUSE mount).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.cluster()
			if err != nil {
				return err
			}
			url, err := c.Up(cmd.Context(), progressLine)
			if err != nil {
				return err
			}
			fmt.Println(url)
			return nil
		},
	}
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
		Long: `Show each process of the cluster, its LSNs and lags, and the disk it takes.

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
