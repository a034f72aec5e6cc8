// Command student-controller keeps a student registry (a SQL database) in line with
// the Student objects of a Kubernetes cluster.
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
	// Root certificates for a PostgreSQL server's TLS (sslmode=verify-full) when the
	// system has none, as in the image, whose base is empty: used only then.
	_ "golang.org/x/crypto/x509roots/fallback"
	logsapi "k8s.io/component-base/logs/api/v1"
	_ "k8s.io/component-base/logs/json/register" // --logging-format=json
	"k8s.io/klog/v2"
	_ "modernc.org/sqlite" // the SQLite driver for sqlite: registry URLs
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// defaultGOGC is the garbage collector's target when the environment sets no GOGC.
// Most of the controller's heap is its cache of Students, which lives as long as they
// do. Go's default, 100, lets the heap grow to twice what is live before it collects;
// 50 lets it grow by half, at a CPU cost within the run-to-run spread
// (bench/results/history.md). GOGC in the environment overrides it; GOMEMLIMIT, set from
// the container's memory limit in config/manager, applies either way.
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
		// Nobody can read a heap profile, so do not sample one: the runtime keeps a
		// record per sampled call stack for the life of the process
		// (bench/results/history.md). Go does the same for programs that do not link
		// the profiler.
		runtime.MemProfileRate = 0
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

// addLoggingFlags adds the logging flags of Kubernetes' own components
// (k8s.io/component-base/logs), as kube-controller-manager has them: -v, --vmodule,
// --logging-format (text, the default, or json), --log-flush-frequency and the alpha
// stream options. It returns the configuration they fill, for logsapi.ValidateAndApply.
func addLoggingFlags(fs *flag.FlagSet) *logsapi.LoggingConfiguration {
	c := logsapi.NewLoggingConfiguration()
	logsapi.AddGoFlags(c, fs)
	return c
}
