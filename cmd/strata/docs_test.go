package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/stratadb/strata/internal/doccheck"
)

// docCommand is a `strata ...` command line quoted in the README or docs/.
type docCommand struct {
	where string
	args  []string
}

var (
	inlineStrata = regexp.MustCompile("`(?:\\./bin/)?strata ([^`]*)`")
	fencedBlock  = regexp.MustCompile("(?s)```(?:sh|bash|console)?\n(.*?)```")
	blockStrata  = regexp.MustCompile(`(?m)^\s*(?:\$ )?(?:\./bin/)?strata (.*)$`)
)

// docCommands returns every strata command line the docs quote, inline
// or in shell blocks (continuation lines joined, comments cut).
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	var out []docCommand
	add := func(f, line string) {
		line, _, _ = strings.Cut(line, " #")
		out = append(out, docCommand{where: f, args: strings.Fields(line)})
	}
	for _, f := range doccheck.Files("../..") {
		b, err := os.ReadFile(filepath.Join("../..", f))
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range fencedBlock.FindAllStringSubmatch(text, -1) {
			block := strings.ReplaceAll(m[1], "\\\n", " ")
			for _, c := range blockStrata.FindAllStringSubmatch(block, -1) {
				add(f, c[1])
			}
		}
		prose := fencedBlock.ReplaceAllString(text, "")
		prose = regexp.MustCompile(`\s*\n\s*`).ReplaceAllString(prose, " ")
		for _, c := range inlineStrata.FindAllStringSubmatch(prose, -1) {
			add(f, c[1])
		}
	}
	return out
}

// TestDocsCommands: every strata command and flag the README and docs/
// quote exists (`strata safekeeper --archive-retain`, `strata bench
// compare --baseline`): a renamed flag or command fails here, not in a
// reader's shell.
func TestDocsCommands(t *testing.T) {
	root := newRootCmd()
	cmds := docCommands(t)
	if len(cmds) < 50 {
		t.Fatalf("found only %d strata command lines in the docs", len(cmds))
	}
	flags := 0
	for _, c := range cmds {
		if notCommands[strings.Join(c.args, " ")] {
			continue
		}
		cmd, rest, err := root.Find(c.args)
		if err != nil || cmd == root {
			t.Errorf("%s: strata %s: no such command (%v)", c.where, strings.Join(c.args, " "), err)
			continue
		}
		// A word that is not a flag after the command found must be an
		// argument, not a misspelt subcommand.
		if len(cmd.Commands()) > 0 && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") && cmd.Args == nil && !cmd.Runnable() {
			t.Errorf("%s: strata %s: %q is not a subcommand of %q", c.where, strings.Join(c.args, " "), rest[0], cmd.CommandPath())
		}
		for _, a := range c.args {
			if !strings.HasPrefix(a, "--") || a == "--" {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
			if lookupFlag(cmd, name) {
				flags++
				continue
			}
			t.Errorf("%s: strata %s: %s has no flag --%s", c.where, strings.Join(c.args, " "), cmd.CommandPath(), name)
		}
	}
	t.Logf("%d command lines, %d flags checked", len(cmds), flags)
}

// notCommands are quoted phrases that start with "strata" and are no
// command line.
var notCommands = map[string]bool{
	"config": true, // the column of strata bench compare that lists a target's config keys
}

// lookupFlag says whether cmd takes --name, its own or inherited.
func lookupFlag(cmd *cobra.Command, name string) bool {
	if name == "help" {
		return true
	}
	for c := cmd; c != nil; c = c.Parent() {
		if c.Flags().Lookup(name) != nil || c.PersistentFlags().Lookup(name) != nil {
			return true
		}
	}
	return false
}
