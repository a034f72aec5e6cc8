// Command bench measures student-controller against the alternatives a user would
// pick, on the real local control plane, and writes into its results folder (-out:
// bench/out by default; bench/results is the committed set) a Markdown table, JSON,
// and a chart of Ready Students over time. `make bench` runs it; BENCH_N sets N.
//
// Every contender gets the same loader, the same control plane, the same N, a fresh
// namespace and an empty registry, one after another in one invocation.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

func main() {
	n := flag.Int("n", 500, "Students per contender")
	out := flag.String("out", "bench/out", "folder for the results (bench/results is the committed set)")
	scratch := flag.String("scratch", "bench/scratch", "folder for binaries, registries and logs (not committed)")
	phase := flag.Duration("phase-timeout", 0, "longest a phase (converge, restart, delete) may take before it is cut off and projected; default scales with N")
	deletePhase := flag.Duration("peer-delete-timeout", 0, "longest the peer's ("+peer+") delete phase may take, when it should be shorter than -phase-timeout: no target reads it, and at N = 100000 it crawls")
	renderOnly := flag.String("render", "", "only rewrite the Markdown and chart of this results JSON")
	pick := flag.String("contenders", "", "comma-separated contenders to run; default all, or at N above 30000 the scale run's: "+strings.Join(scaleRun, ", "))
	only := flag.String("only", "", "run only this contender, or \"sweep\" for the sweep timings, for investigation (results are not written)")
	flags := flag.String("flags", "", "with -only: more flags for the contender, e.g. --pprof-bind-address=127.0.0.1:6060")
	profiles := flag.Bool("profiles", false, "take CPU profiles of kube-apiserver in the middle of each contender's converge, into the results folder's profiles/")
	hold := flag.Duration("hold", 0, "with -only: keep the contender running this long after measuring its steady memory, to inspect it")
	flag.Parse()
	if (*flags != "" || *hold != 0) && *only == "" {
		fmt.Fprintln(os.Stderr, "bench: -flags and -hold are for investigating one contender: they need -only")
		os.Exit(2)
	}
	if *renderOnly != "" {
		if err := rerender(*renderOnly); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *phase == 0 {
		*phase = max(30*time.Second, time.Duration(*n)*36*time.Millisecond)
	}
	if *deletePhase < 0 {
		fmt.Fprintln(os.Stderr, "bench: -peer-delete-timeout must not be negative")
		os.Exit(2)
	}
	if *deletePhase == 0 || *deletePhase > *phase {
		*deletePhase = *phase
	}
	inv := investigation{only: *only, flags: strings.Fields(*flags), hold: *hold}
	if *profiles {
		inv.profiles = filepath.Join(*out, "profiles")
	}
	var picked []string
	switch {
	case *pick != "":
		picked = strings.Split(*pick, ",")
	case *n > 3*targetN:
		picked = scaleRun
	}
	if err := run(*n, *out, *scratch, phases{all: *phase, peerDelete: *deletePhase}, picked, inv); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// investigation narrows a run to one contender, changed as it says, or has it profiled.
type investigation struct {
	only  string
	flags []string
	hold  time.Duration
	// profiles is where kube-apiserver's CPU profiles go (-profiles), or "".
	profiles string
}

// scaleRun are the contenders a scale run measures, in the order it runs them: its
// targets are set against the status-only floor and the peer. The others' targets are
// set at N = 10000, and skippedWhy says why each is left out. The peer runs last: a
// delete that -peer-delete-timeout cuts off leaves its Students in etcd, where they
// would weigh on the contenders after it.
var scaleRun = []string{"student-controller", floorStatusOnly, peer}

// peer is the contender that student-controller's memory targets are set against.
const peer = "controller-runtime"

// phases are how long each phase of a contender may take.
type phases struct {
	all        time.Duration // every phase, but the peer's delete when peerDelete is shorter
	peerDelete time.Duration
}

var skippedWhy = map[string]string{
	"student-controller-no-policy": "its targets are set at N = 10000; it makes student-controller's syncs plus the finalizer write per Student",
	"original-settings": "its client limit (QPS 5, burst 10) sets its pace whatever N is, so a run here would only be cut off and " +
		"projected from the same rate",
	floorTwoWrites:      "the targets at this N are against the status-only floor, the one write a controller makes with the policy",
	noHistory:           historyAtTargetN,
	onPostgres:          historyAtTargetN,
	onPostgresNoHistory: historyAtTargetN,
	withCBOR:            bytesAtTargetN,
	floorStatusOnlyCBOR: bytesAtTargetN,
	noWatchGzip:         bytesAtTargetN,
}

const bytesAtTargetN = "what CBOR and the watch's gzip change is measured at N = 10000"

const historyAtTargetN = "what the history costs is measured at N = 10000"

func run(n int, outDir, scratch string, phase phases, picked []string, inv investigation) error {
	var names []string
	for _, c := range contenders(binaries{}) {
		names = append(names, c.name)
	}
	for _, name := range picked {
		if !slices.Contains(names, name) {
			return fmt.Errorf("no contender %q; there are %s", name, strings.Join(names, ", "))
		}
	}
	var left []skipped
	if len(picked) > 0 {
		for _, name := range names {
			if !slices.Contains(picked, name) {
				why := "not picked (-contenders)"
				if slices.Equal(picked, scaleRun) { // the scale run's own choice
					why = cmp.Or(skippedWhy[name], why)
				}
				left = append(left, skipped{Name: name, Why: why})
			}
		}
	}
	names = append(names, onlySweep)
	if inv.only != "" && !slices.Contains(names, inv.only) {
		return fmt.Errorf("no contender %q; there are %s", inv.only, strings.Join(names, ", "))
	}
	// A signal ends the run: the phase in progress returns, and the deferred stops take
	// the contender and the control plane down with it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	scratch, _ = filepath.Abs(scratch)
	if err := os.RemoveAll(scratch); err != nil {
		return err
	}
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		return err
	}
	// One PostgreSQL for the sweeps and the contenders with a PostgreSQL registry, each
	// in a database of its own.
	var pg *pgtest.Server
	if inv.only == "" || inv.only == onlySweep || inv.only == onPostgres || inv.only == onPostgresNoHistory {
		say("starting PostgreSQL (Debian's, fsync off)")
		if pg, err = pgtest.Start(ctx); err != nil {
			return fmt.Errorf("start PostgreSQL: %w", err)
		}
		defer pg.Close()
	}
	if inv.only == onlySweep { // the sweeps need no control plane
		_, err := measureSweeps(ctx, n, scratch, pg)
		return err
	}
	rev := revision() // what is built now, not what the tree holds once the run is over
	bins, err := build(ctx, root, scratch)
	if err != nil {
		return err
	}
	// The sweeps first: they take a minute and need no control plane, and a failure
	// there must not cost the contenders' half hour.
	var sweeps []sweepResult
	if inv.only == "" {
		if sweeps, err = measureSweeps(ctx, n, scratch, pg); err != nil {
			return err
		}
	}

	if inv.profiles != "" {
		if err := os.MkdirAll(inv.profiles, 0o755); err != nil {
			return err
		}
	}
	say("starting the control plane (bin/k8s: etcd, kube-apiserver, kube-controller-manager)")
	// The admission policy is installed for the contenders that ship with it, and
	// removed for the others, before each one starts.
	env, err := controlplane.Start(controlplane.Options{Root: root, WithoutAdmissionPolicy: true})
	if err != nil {
		return err
	}
	defer env.Stop()

	// The loader and the observer are not rate limited: they must never be the
	// bottleneck being measured.
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = -1, 0
	h := &harness{
		n: n, phase: phase.all, peerDeletePhase: phase.peerDelete, scratch: scratch, kubeconfig: env.Kubeconfig,
		kube:     kubernetes.NewForConfigOrDie(cfg),
		students: versioned.NewForConfigOrDie(cfg),
		flags:    inv.flags, hold: inv.hold, pg: pg, profiles: inv.profiles,
		restartAPIServer: env.RestartAPIServer,
		apiServerCPU:     func() float64 { return env.APIServer.Usage().CPUSeconds },
		policy: func(ctx context.Context, installed bool) error {
			if installed {
				return env.InstallAdmissionPolicy(ctx)
			}
			return env.RemoveAdmissionPolicy(ctx)
		},
	}
	var results []*result
	all := contenders(bins)
	// In the order picked: a scale run puts the peer last.
	slices.SortStableFunc(all, func(a, b contender) int {
		return cmp.Compare(slices.Index(picked, a.name), slices.Index(picked, b.name))
	})
	for _, c := range all {
		if inv.only != "" && c.name != inv.only || len(picked) > 0 && !slices.Contains(picked, c.name) {
			continue
		}
		say("contender %s: %s", c.name, c.describe)
		r, err := h.measure(ctx, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		results = append(results, r)
		say("contender %s: %s", c.name, r.summary())
	}
	if inv.only != "" {
		return nil // a partial run is not a result
	}
	return writeResults(outDir, n, phase, rev, bins.goVersion, results, sweeps, left)
}

// onlySweep is the name -only takes to time the sweeps alone.
const onlySweep = "sweep"

func say(format string, args ...any) {
	fmt.Printf("%s bench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
