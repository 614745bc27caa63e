package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/stratadb/strata/core/safekeeper"
)

// fetchMain is `skproc fetch SEGMENT DEST --safekeepers A,B`: the same as
// `strata wal fetch`, for restore_command in tests.
func fetchMain(args []string) int {
	fl := pflag.NewFlagSet("fetch", pflag.ContinueOnError)
	sks := fl.StringSlice("safekeepers", nil, "safekeeper gRPC addresses")
	if err := fl.Parse(args); err != nil || fl.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: skproc fetch SEGMENT DEST --safekeepers A,B")
		return 2
	}
	name, dest := fl.Arg(0), fl.Arg(1)
	tmp, err := os.CreateTemp(filepath.Dir(dest), ".fetch-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.Remove(tmp.Name())
	if err := safekeeper.FetchSegment(context.Background(), safekeeper.FetchOptions{Safekeepers: *sks}, name, tmp); err != nil {
		tmp.Close()
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	tmp.Close()
	if err := os.Rename(tmp.Name(), dest); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
