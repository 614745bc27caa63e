// Command skproc runs one safekeeper as its own process, for tests that kill
// safekeepers with SIGKILL (the same wiring as `strata safekeeper`).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/stratadb/strata/core/safekeeper"
	"github.com/stratadb/strata/plugins/objectstore/fs"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "fetch" {
		os.Exit(fetchMain(os.Args[2:]))
	}
	cfg := safekeeper.DefaultConfig()
	fl := pflag.NewFlagSet("skproc", pflag.ExitOnError)
	safekeeper.BindFlags(fl, &cfg)
	archiveDir := fl.String("archive-dir", "", "fs object store root for archiving")
	fl.Parse(os.Args[1:])
	log := zerolog.New(os.Stderr).With().Timestamp().Logger()
	deps := safekeeper.Deps{Logger: log}
	if *archiveDir != "" {
		st, err := fs.New(fs.Config{Root: *archiveDir}, log)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		deps.Archive = st
	}
	n, err := safekeeper.New(cfg, deps)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := n.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
