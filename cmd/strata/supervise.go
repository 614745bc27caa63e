package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rs/zerolog"

	"github.com/stratadb/strata/core/config"
	"github.com/stratadb/strata/core/supervise"
)

// restartOnCrashFlag is the flag that makes a server command supervise
// itself; strata up passes it to every process it starts.
const restartOnCrashFlag = "restart-on-crash"

// superviseSelf runs this command again without --restart-on-crash as a
// supervised child (core/supervise): restarted when it dies after it was
// good (readyFile exists, or without one it ran 10 s), SIGTERM passed on,
// killed when the supervisor dies. A configuration error (exit status
// exitConfig) is final; a panic (the Go runtime's exit status 2) is a
// crash like any other. stuck, when not nil, releases a child that was
// killed but cannot finish exiting (supervise.Options.Stuck).
func superviseSelf(ctx context.Context, name, readyFile string, stuck func(pid int), log zerolog.Logger, firstOnly ...string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := withoutFlag(os.Args[1:], restartOnCrashFlag, false)
	restartArgs := args
	for _, f := range firstOnly {
		restartArgs = withoutFlag(restartArgs, f, true)
	}
	o := supervise.Options{
		Path: self, Args: args, RestartArgs: restartArgs, Stdout: os.Stdout, Stderr: os.Stderr,
		Name: name, Final: []int{exitConfig}, Log: log,
		Started: func(pid int) { log.Info().Int("pid", pid).Msg(name + " started") },
		Stuck:   stuck,
	}
	if readyFile != "" {
		o.Ready = func() bool { _, err := os.Stat(readyFile); return err == nil }
		o.Reset = func() { _ = os.Remove(readyFile) }
	}
	err = supervise.Run(ctx, o)
	var ee *supervise.ExitError
	if errors.As(err, &ee) && ee.Code == exitConfig {
		return fmt.Errorf("%w: %w", config.ErrInvalid, err)
	}
	return err
}

// withoutFlag returns args without the flag --name (and its value, the
// next argument, when it takes one and is not given as --name=value).
func withoutFlag(args []string, name string, takesValue bool) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "--"+name+"=") {
			continue
		}
		if a == "--"+name {
			if takesValue {
				i++
			}
			continue
		}
		out = append(out, a)
	}
	return out
}
