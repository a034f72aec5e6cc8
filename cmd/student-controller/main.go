// Command student-controller keeps a student registry (SQL) in line with Student objects.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	_ "github.com/jackc/pgx/v5/stdlib" // the PostgreSQL driver for postgres: registry URLs
	// Fallback root certificates for PostgreSQL TLS: the image's empty base has none.
	_ "golang.org/x/crypto/x509roots/fallback"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
	_ "modernc.org/sqlite" // the SQLite driver for sqlite: registry URLs
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// defaultGOGC is the GC target when GOGC is unset. Most of the heap is the long-lived
// Student cache, so 50 (grow by half, not double) saves memory at a CPU cost within noise
// (bench/results/history.md). GOMEMLIMIT, set in config/manager, applies either way.
const defaultGOGC = 50

func main() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(defaultGOGC)
	}
	if len(os.Args) > 1 && os.Args[1] == "registry" {
		os.Exit(registryCommand(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == "plan" {
		os.Exit(planCommand(context.Background(), os.Args[2:], os.Stdout, os.Stderr))
	}
	var opts options
	opts.addCommandFlags(flag.CommandLine)
	logging := addLoggingFlags(flag.CommandLine)
	flag.Parse()
	if opts.version {
		fmt.Println(versionString())
		return
	}
	opts.recordSet(flag.CommandLine)
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "student-controller: unexpected arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	if err := opts.validate(); err != nil {
		fmt.Fprintf(os.Stderr, "student-controller: %v\n", err)
		os.Exit(2)
	}
	if err := logsapi.ValidateAndApply(logging, nil); err != nil {
		fmt.Fprintf(os.Stderr, "student-controller: logging flags: %v\n", err)
		os.Exit(2)
	}
	if opts.pprofAddr == "0" {
		// Without pprof nobody reads a heap profile, and the runtime keeps each sampled
		// stack for the life of the process (bench/results/history.md).
		runtime.MemProfileRate = 0
	}

	ctrllog.SetLogger(klog.NewKlogr()) // the metrics server comes from controller-runtime, which logs through logr

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

// addLoggingFlags adds kube-controller-manager's logging flags (component-base) and
// returns the configuration they fill.
func addLoggingFlags(fs *flag.FlagSet) *logsapi.LoggingConfiguration {
	c := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(c, fs)
	return c
}
