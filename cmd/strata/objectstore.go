package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/stratadb/strata/core/objstore"
	"github.com/stratadb/strata/sdk/objectstore"
)

// progressFrom is the size from which transfers show a progress bar.
const progressFrom = 4 << 20

func newObjectStoreCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "objectstore",
		Aliases: []string{"os"},
		Short:   "Read and write the configured object store (put, get, ls, stat, rm)",
	}
	var ifNotExists, noProgress bool
	open := func(ctx context.Context) (objectstore.Store, error) {
		cfg, err := a.load()
		if err != nil {
			return nil, err
		}
		log, err := a.logger(cfg, "objectstore")
		if err != nil {
			return nil, err
		}
		return objstore.Open(ctx, cfg.ObjectStore, log, nil)
	}
	bar := func(size int64, what string) *progressbar.ProgressBar {
		if noProgress || size < progressFrom || !term.IsTerminal(int(os.Stderr.Fd())) {
			return nil
		}
		return progressbar.DefaultBytes(size, what)
	}

	put := &cobra.Command{
		Use:   "put KEY [FILE|-]",
		Short: "Store FILE (or standard input) under KEY",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			var (
				r    io.Reader = os.Stdin
				size int64     = -1
			)
			if len(args) == 2 && args[1] != "-" {
				f, err := os.Open(args[1])
				if err != nil {
					return err
				}
				defer f.Close()
				st, err := f.Stat()
				if err != nil {
					return err
				}
				r, size = f, st.Size()
			}
			s, err := open(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if b := bar(size, "put "+args[0]); b != nil {
				defer b.Close()
				r = io.TeeReader(r, b)
			}
			return s.Put(ctx, args[0], r, objectstore.PutOptions{IfNotExists: ifNotExists, Size: size})
		},
	}
	put.Flags().BoolVar(&ifNotExists, "if-not-exists", false, "fail if KEY already exists")

	get := &cobra.Command{
		Use:   "get KEY [FILE|-]",
		Short: "Write the object KEY to FILE (or standard output)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := open(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			info, err := s.Stat(ctx, args[0])
			if err != nil {
				return err
			}
			rc, err := s.Get(ctx, args[0])
			if err != nil {
				return err
			}
			defer rc.Close()
			var w io.Writer = os.Stdout
			if len(args) == 2 && args[1] != "-" {
				tmp := args[1] + ".part"
				f, err := os.Create(tmp)
				if err != nil {
					return err
				}
				if err := copyWithBar(f, rc, bar(info.Size, "get "+args[0])); err != nil {
					f.Close()
					os.Remove(tmp)
					return err
				}
				if err := f.Close(); err != nil {
					os.Remove(tmp)
					return err
				}
				return os.Rename(tmp, args[1])
			}
			return copyWithBar(w, rc, bar(info.Size, "get "+args[0]))
		},
	}

	ls := &cobra.Command{
		Use:   "ls [PREFIX]",
		Short: "List objects whose key starts with PREFIX",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			prefix := ""
			if len(args) == 1 {
				prefix = args[0]
			}
			s, err := open(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
			n, total := 0, int64(0)
			err = s.List(ctx, prefix, func(o objectstore.ObjectInfo) error {
				n++
				total += o.Size
				_, err := fmt.Fprintf(tw, "%d\t  %s\t  %s\n", o.Size, o.ModTime.UTC().Format("2006-01-02 15:04:05"), o.Key)
				return err
			})
			tw.Flush()
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%d object(s), %d bytes\n", n, total)
			return nil
		},
	}

	stat := &cobra.Command{
		Use:   "stat KEY",
		Short: "Show an object's size and time",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := open(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			info, err := s.Stat(ctx, args[0])
			if err != nil {
				return err
			}
			fmt.Printf("key: %s\nsize: %d\nmodified: %s\n", info.Key, info.Size, info.ModTime.UTC().Format("2006-01-02T15:04:05Z"))
			return nil
		},
	}

	rm := &cobra.Command{
		Use:   "rm KEY...",
		Short: "Delete objects (a missing key is not an error)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := open(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			for _, k := range args {
				if err := s.Delete(ctx, k); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.PersistentFlags().BoolVar(&noProgress, "no-progress", false, "never show a progress bar")
	cmd.AddCommand(put, get, ls, stat, rm)
	return cmd
}

func copyWithBar(w io.Writer, r io.Reader, b *progressbar.ProgressBar) error {
	if b != nil {
		defer b.Close()
		w = io.MultiWriter(w, b)
	}
	_, err := io.Copy(w, r)
	return err
}
