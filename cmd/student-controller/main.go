// Command student-controller keeps a student registry (a SQL database) in line with
// the Student objects of a Kubernetes cluster.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver for postgres: registry URLs
	"k8s.io/klog/v2"
	_ "modernc.org/sqlite" // the SQLite driver for sqlite: registry URLs
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	klog.InitFlags(nil)
	var opts options
	opts.addFlags(flag.CommandLine)
	showVersion := flag.Bool("version", false, "Print the version and exit.")
	flag.Parse()
	if *showVersion {
		fmt.Println(versionString())
		return
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "student-controller: unexpected arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	if err := opts.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "student-controller: %v\n", err)
		os.Exit(2)
	}

	// The metrics server comes from controller-runtime, which logs through logr.
	ctrllog.SetLogger(klog.NewKlogr())

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	if err := run(ctx, opts); err != nil {
		klog.Flush()
		fmt.Fprintf(os.Stderr, "student-controller: %v\n", err)
		os.Exit(1)
	}
	klog.Flush()
}
