// Command strata is the one binary of strata: every server and tool is a
// sub-command. This file holds the root command and the plumbing every
// sub-command shares (config file, logger); each sub-command lives in its
// own file and owns nothing but flags and wiring.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/logging"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// app carries what the root command's flags decide to every sub-command.
type app struct {
	configPath string
	logLevel   string
	logFormat  string
}

// load reads and validates the config file named by --config.
func (a *app) load() (*config.Config, error) {
	path := a.configPath
	if path == "" {
		path = config.DefaultPath
		if _, err := os.Stat(path); err != nil {
			path = "" // defaults only: the embedded single-machine cluster
		}
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if a.logLevel != "" {
		cfg.Log.Level = a.logLevel
	}
	if a.logFormat != "" {
		cfg.Log.Format = a.logFormat
	}
	return cfg, nil
}

// logger builds the process logger from the config, tagged with component.
func (a *app) logger(cfg *config.Config, component string) (zerolog.Logger, error) {
	log, err := logging.New(os.Stderr, cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		return log, err
	}
	return log.With().Str("component", component).Logger(), nil
}

func newRootCmd() *cobra.Command {
	a := &app{}
	root := &cobra.Command{
		Use:   "strata",
		Short: "Stock PostgreSQL on disaggregated storage",
		Long: `strata runs an unmodified PostgreSQL 15 on disaggregated storage: a WAL quorum
of safekeepers, a pageserver of versioned pages, and an object store, each a plugin
chosen in one YAML file (--config, default configs/local.yaml).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.PersistentFlags().StringVar(&a.configPath, "config", "", "config file (default configs/local.yaml when present, else built-in defaults)")
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "", "override log.level (debug, info, warn, error)")
	root.PersistentFlags().StringVar(&a.logFormat, "log-format", "", "override log.format (auto, json, console)")
	wal := &cobra.Command{Use: "wal", Short: "Read WAL: dump records and statistics, fetch segments"}
	wal.AddCommand(newWALDumpCmd(), newWALFetchCmd(a))
	root.AddCommand(
		newUpCmd(a),
		newDownCmd(a),
		newStatusCmd(a),
		newRestoreCmd(a),
		newComputeCmd(a),
		newObjectStoreCmd(a),
		wal,
		newSafekeeperCmd(a),
		withPageserverBench(newPageserverCmd()),
		newTimelineCmd(),
		newBenchCmd(),
	)
	strictGroups(root)
	return root
}

// strictGroups makes every command that only groups others (wal,
// objectstore, timeline, bench) fail on a word that names none of them.
// Cobra answers only the root that way; a group printed its help and
// exited 0, so a script's `strata timeline brnach ...` seemed to succeed.
// Without arguments a group still prints its help.
func strictGroups(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		strictGroups(c)
	}
	if !cmd.HasParent() || !cmd.HasSubCommands() || cmd.Runnable() {
		return
	}
	cmd.DisableFlagsInUseLine = true // "strata wal", not "strata wal [flags]"
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if len(args) == 0 {
			return c.Help()
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if c.SuggestionsMinimumDistance <= 0 {
			c.SuggestionsMinimumDistance = 2 // what the root uses
		}
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "; did you mean " + strings.Join(s, " or ") + "?"
		}
		return errors.New(msg + " (run '" + c.CommandPath() + " --help' for its commands)")
	}
}

// exitConfig is the exit status of a configuration error (EX_CONFIG of
// sysexits.h). Not 2: the Go runtime exits with 2 after a panic, and a
// supervisor must restart a crash but never a bad configuration.
const exitConfig = 78

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "strata:", err)
		if errors.Is(err, config.ErrInvalid) {
			os.Exit(exitConfig)
		}
		os.Exit(1)
	}
}
