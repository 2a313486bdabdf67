// Command release packages one build of isopod for linux/amd64: a .deb and
// an .rpm (made with nfpm), a tarball, and SHA256SUMS over the three. Every
// byte follows from the inputs: the binaries, the source tree, the version
// and the commit time (SOURCE_DATE_EPOCH); nothing depends on the clock, the
// host or the order files were found in.
//
// scripts/release.sh builds the binaries from a commit and runs this
// program; run it by hand only to package binaries you built the same way:
//
//	go run . -src ../.. -bin BIN -version 0.1.0+g1a2b3c4d -commit HASH -epoch 1700000000 -out ../../dist
//
// It is a module of its own, so that nfpm and everything it pulls in stay
// out of isopod's go.mod and can never be linked into isopod's binaries.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("release", flag.ContinueOnError)
	var r Release
	var epoch string
	fs.StringVar(&r.Src, "src", "", "the source tree of the commit (docs, plugin, skill, VERSION)")
	fs.StringVar(&r.Bin, "bin", "", "directory holding isopod, isopod-mcp, isopod-agent and isopod-jail as built for the release")
	fs.StringVar(&r.Version, "version", "", "the version the binaries report, e.g. 0.1.0 or 0.1.0+g1a2b3c4d")
	fs.StringVar(&r.Commit, "commit", "", "the commit the binaries were built from")
	fs.StringVar(&epoch, "epoch", os.Getenv("SOURCE_DATE_EPOCH"), "the commit time in seconds since 1970 (default $SOURCE_DATE_EPOCH): every timestamp in the packages")
	fs.StringVar(&r.Out, "out", "dist", "where to write the packages and SHA256SUMS")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if epoch == "" {
		return errors.New("-epoch (or SOURCE_DATE_EPOCH) is required")
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || sec <= 0 {
		return fmt.Errorf("-epoch %q: want seconds since 1970", epoch)
	}
	r.Epoch = sec
	arts, err := r.Build(ctx)
	if err != nil {
		return err
	}
	for _, a := range arts {
		fmt.Println(a)
	}
	return nil
}
