package main

import (
	"context"
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/mod/modfile"

	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
)

// contender is one way of doing the work.
type contender struct {
	name     string
	describe string
	args     func(h *harness, ns, registryURL, metricsAddr, probeAddr string) []string
	bin      string
	// registry: it writes rows, and converging includes them.
	registry bool
	// reconciles is the metric that counts its syncs (for the restart phase).
	reconciles string
	// policy: config/admission's policy is installed for its run, so the API server
	// adds the finalizer to each new Student.
	policy bool
	// createdWithFinalizer: the loader creates the Students with the finalizer already
	// on them (the status-only floor: the policy's effect, without the policy's cost).
	createdWithFinalizer bool
	// postgres: its registry is a database of the bench's PostgreSQL, not a SQLite file.
	postgres bool
	// withoutHistory: built without the history row (-tags bench_nohistory).
	withoutHistory bool
	// apiServerFlags are set on kube-apiserver's command line for its run (the API
	// server is started again with them, and again without for the next contender
	// that has none); clientEnv is added to its environment.
	apiServerFlags []string
	clientEnv      []string
}

// cborServer and cborClient turn CBOR on: kube-apiserver serves and stores custom
// resources as CBOR (an alpha gate in v1.37), and client-go sends and asks for it
// (alpha gates too, read from the environment).
var (
	cborServer = []string{"--feature-gates=CBORServingAndStorage=true"}
	cborClient = []string{"KUBE_FEATURE_ClientsAllowCBOR=true", "KUBE_FEATURE_ClientsPreferCBOR=true"}
)

type binaries struct {
	controller, controllerNoHistory, peer, floor string
	// goVersion is the Go release the contenders were built with, for the report.
	goVersion string
}

func build(ctx context.Context, root, scratch string) (binaries, error) {
	b := binaries{
		controller:          filepath.Join(scratch, "student-controller"),
		controllerNoHistory: filepath.Join(scratch, "student-controller-no-history"),
		peer:                filepath.Join(scratch, "peer"),
		floor:               filepath.Join(scratch, "floor"),
	}
	// The contenders are built with the Go that go.mod pins, as make bench and the
	// release build them, whatever Go runs the bench: a machine's own Go (GOTOOLCHAIN
	// local in its go.env) would otherwise build them, and the results would name it.
	pinned, err := pinnedToolchain(filepath.Join(root, "go.mod"))
	if err != nil {
		return b, err
	}
	if os.Getenv("GOTOOLCHAIN") == "" {
		if err := os.Setenv("GOTOOLCHAIN", pinned); err != nil {
			return b, err
		}
	}
	// Static, as the image ships it (and as kubebuilder's Dockerfile builds): ctrlbin
	// builds without the race detector so.
	for _, bin := range []ctrlbin.Build{
		{Package: "./cmd/student-controller", Out: b.controller},
		{Package: "./cmd/student-controller", Out: b.controllerNoHistory, Tags: "bench_nohistory"},
		{Package: "./test/bench/peer", Out: b.peer},
		{Package: "./test/bench/floor", Out: b.floor},
	} {
		say("building %s %s", bin.Package, bin.Tags)
		bin.Root = root
		if _, err := bin.Run(ctx); err != nil {
			return b, err
		}
	}
	info, err := buildinfo.ReadFile(b.controller)
	if err != nil {
		return b, fmt.Errorf("read the Go version %s was built with: %w", b.controller, err)
	}
	b.goVersion = info.GoVersion
	if b.goVersion != pinned {
		return b, fmt.Errorf("the contenders were built with %s, but go.mod pins %s: unset GOTOOLCHAIN, or set it to %s", b.goVersion, pinned, pinned)
	}
	return b, nil
}

// pinnedToolchain is the Go release go.mod's toolchain line names, such as go1.26.11.
func pinnedToolchain(gomod string) (string, error) {
	data, err := os.ReadFile(gomod) // #nosec G304 -- the repository's own go.mod
	if err != nil {
		return "", err
	}
	f, err := modfile.Parse(gomod, data, nil)
	if err != nil {
		return "", err
	}
	if f.Toolchain == nil {
		return "", fmt.Errorf("%s has no toolchain line: the bench builds its contenders with the Go it names", gomod)
	}
	return f.Toolchain.Name, nil
}

func contenders(b binaries) []contender {
	controllerArgs := func(extra ...string) func(h *harness, ns, reg, m, p string) []string {
		return func(h *harness, ns, reg, m, p string) []string {
			return append([]string{"--kubeconfig", h.kubeconfig, "--namespace", ns, "--registry", reg,
				"--metrics-bind-address", m, "--health-probe-bind-address", p}, extra...)
		}
	}
	floorArgs := func(h *harness, ns, _, m, _ string) []string {
		return []string{"--kubeconfig", h.kubeconfig, "--namespace", ns, "--metrics-bind-address", m,
			"--kube-api-qps=500", "--kube-api-burst=1000", "--workers=8"}
	}
	return []contender{
		{
			name: "student-controller", describe: "as shipped: defaults, with config/admission's policy installed (the API server adds the finalizer on create)",
			bin: b.controller, registry: true, reconciles: "student_controller_reconcile_total", policy: true,
			args: controllerArgs(),
		},
		{
			name: noHistory, describe: "as shipped, built without the history row (-tags bench_nohistory, which no shipped build uses): what the history costs on SQLite",
			bin: b.controllerNoHistory, registry: true, reconciles: "student_controller_reconcile_total", policy: true, withoutHistory: true,
			args: controllerArgs(),
		},
		{
			name: onPostgres, describe: "as shipped, on PostgreSQL (Debian's 15, started by the bench with fsync off, on the same machine)",
			bin: b.controller, registry: true, reconciles: "student_controller_reconcile_total", policy: true, postgres: true,
			args: controllerArgs(),
		},
		{
			name: onPostgresNoHistory, describe: "as shipped, on PostgreSQL, built without the history row: what the history costs on PostgreSQL",
			bin: b.controllerNoHistory, registry: true, reconciles: "student_controller_reconcile_total", policy: true, postgres: true, withoutHistory: true,
			args: controllerArgs(),
		},
		{
			name: "student-controller-no-policy", describe: "defaults, without the admission policy (an older cluster): it adds the finalizer itself",
			bin: b.controller, registry: true, reconciles: "student_controller_reconcile_total",
			args: controllerArgs(),
		},
		{
			name: "original-settings", describe: "student-controller with the original controller's settings: QPS 5, burst 10, 2 workers, client-go's default rate limiter; no admission policy",
			bin: b.controller, registry: true, reconciles: "student_controller_reconcile_total",
			args: controllerArgs("--kube-api-qps=5", "--kube-api-burst=10", "--workers=2", "--workqueue-rate-limiter=client-go"),
		},
		{
			name: "controller-runtime", describe: "a kubebuilder-style controller-runtime v0.25 reconciler with its defaults (1 concurrent reconcile, default cache, client-side rate limit off as ctrl.GetConfig leaves it), as its scaffold ships: no admission policy",
			bin: b.peer, registry: true, reconciles: "controller_runtime_reconcile_total",
			args: func(h *harness, ns, reg, m, p string) []string {
				return []string{"--kubeconfig", h.kubeconfig, "--namespace", ns, "--registry", reg,
					"--metrics-bind-address", m, "--health-probe-bind-address", p}
			},
		},
		{
			name: floorTwoWrites, describe: "only the API writes a controller makes without the policy (finalizer, then status) at student-controller's client settings (QPS 500, burst 1000, 8 workers); no informer, no registry",
			bin: b.floor, args: floorArgs,
		},
		{
			name: floorStatusOnly, describe: "the same floor on Students created with the finalizer: only the status write, as a controller makes with the policy",
			bin: b.floor, args: floorArgs, createdWithFinalizer: true,
		},
		{
			name: withCBOR, describe: "as shipped, with CBOR on both sides: kube-apiserver's CBORServingAndStorage gate, the controller's ClientsAllowCBOR and ClientsPreferCBOR (all alpha in v1.37)",
			bin: b.controller, registry: true, reconciles: "student_controller_reconcile_total", policy: true,
			args: controllerArgs(), apiServerFlags: cborServer, clientEnv: cborClient,
		},
		{
			name: floorStatusOnlyCBOR, describe: "the status-only floor with CBOR on both sides, as " + withCBOR + " has it",
			bin: b.floor, args: floorArgs, createdWithFinalizer: true, apiServerFlags: cborServer, clientEnv: cborClient,
		},
		{
			name: noWatchGzip, describe: "as shipped, with kube-apiserver's WatchListCompression gate off: the watch that starts with the list is not gzipped",
			bin: b.controller, registry: true, reconciles: "student_controller_reconcile_total", policy: true,
			args: controllerArgs(), apiServerFlags: []string{"--feature-gates=WatchListCompression=false"},
		},
	}
}

// The contenders that measure how the bytes travel, each beside the one it differs
// from: withCBOR and floorStatusOnlyCBOR beside student-controller and
// floorStatusOnly, noWatchGzip beside student-controller.
const (
	withCBOR            = "student-controller-cbor"
	floorStatusOnlyCBOR = "floor-status-only-cbor"
	noWatchGzip         = "student-controller-no-watch-gzip"
)

// The floors' names: the results are measured against them.
const (
	floorTwoWrites  = "floor"
	floorStatusOnly = "floor-status-only"
)

// The contenders that show what the history costs, each beside the one it differs
// from only by the history: student-controller on SQLite, onPostgres on PostgreSQL.
const (
	noHistory           = "student-controller-no-history"
	onPostgres          = "student-controller-postgres"
	onPostgresNoHistory = "student-controller-postgres-no-history"
)
