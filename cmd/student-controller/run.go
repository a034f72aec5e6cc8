package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
)

// run builds every dependency, serves probes and metrics, and runs the controller
// (while it leads, with --leader-elect) until ctx is done; then it drains and returns.
func run(ctx context.Context, opts options) error {
	logger := klog.FromContext(ctx)
	logger.Info("Starting", "version", versionString())

	cfg, err := clientcmd.BuildConfigFromFlags(opts.master, opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("build client config: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(opts.qps), opts.burst

	kubeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("kubernetes client: %w", err)
	}

	var servers sync.WaitGroup
	defer servers.Wait()
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()

	// Probes first: while the registry is out of reach the Pod is alive and not ready,
	// rather than a crash loop.
	var watchdog *leaderelection.HealthzAdaptor
	if opts.leaderElect && !opts.dryRun {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	var running atomic.Pointer[controller.Controller]
	// fenceHolder is the controller this one waits for, while it does; keeper keeps
	// the registry's mark, and says when the registry is behind it.
	var fenceHolder, behind, crdProblem atomic.Pointer[string]
	var keeperRef atomic.Pointer[markKeeper]
	ready := func() error {
		c := running.Load()
		if c == nil || !c.HasSynced() {
			return errors.New("the Student cache has not synced")
		}
		if err := c.CRDOlder(); err != nil {
			return err
		}
		if problem := crdProblem.Load(); problem != nil {
			return errors.New(*problem)
		}
		if holder := fenceHolder.Load(); holder != nil {
			return fmt.Errorf("another controller of owner %q holds the registry's write fence: %s", opts.owner, *holder)
		}
		if k := keeperRef.Load(); k != nil {
			return k.Ready()
		}
		return nil
	}
	if opts.probeAddr != "0" {
		probes := &http.Server{Addr: opts.probeAddr, Handler: probeHandler(ready, watchdog), ReadHeaderTimeout: 5 * time.Second}
		if err := listenAndServe(serveCtx, &servers, probes, "probes"); err != nil {
			return err
		}
	}

	reg, writable, cluster, closeRegistry, err := open(ctx, opts, kubeClient)
	if err != nil || reg == nil {
		return err // nil: stopped before the registry answered
	}
	defer closeRegistry()
	logger.Info("Registry open", "registry", reg.String(), "owner", opts.owner, "readOnly", opts.dryRun, "scope", opts.scope.String())

	// controller-runtime's registry already carries client-go's REST client and leader
	// election metrics; the process's, the Go runtime's, the workqueue's and the
	// controller's join it.
	crmetrics.Registry.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	workqueue.SetProvider(controller.NewWorkqueueMetricsProvider(crmetrics.Registry))
	metrics := controller.NewMetrics(crmetrics.Registry)

	rateLimiter := controller.DefaultRateLimiter()
	if opts.rateLimiter == "client-go" {
		rateLimiter = workqueue.DefaultTypedControllerRateLimiter[string]()
	}
	// With leader election the gate is the elector's; without, it always says yes; in a
	// dry run, always no.
	gate := &leaseGate{}
	leading := gate.check
	if opts.dryRun {
		leading = func() error { return errDryRun }
	}
	tracerProvider, stopTracing, err := startTracing(ctx, opts)
	if err != nil {
		return fmt.Errorf("--tracing-endpoint: %w", err)
	}
	defer stopTracing()
	var keeper *markKeeper
	if namespace, name := markPlace(opts); namespace != "" && !opts.dryRun {
		keeper = &markKeeper{client: kubeClient, namespace: namespace, name: name, owner: opts.owner, reg: writable,
			metrics: metrics, pod: podReference(), behind: &behind}
	} else if !opts.dryRun {
		logger.Info("The registry's mark is not kept in the cluster: with no namespace for it (--registry-mark-namespace, POD_NAMESPACE), " +
			"a registry put back in time is not noticed")
	}
	var registryBehind func() error
	if keeper != nil {
		registryBehind = keeper.Behind
		keeperRef.Store(keeper)
	}
	wiring, err := controller.NewWiring(ctx, cfg, reg, controller.WiringOptions{
		Scope:          opts.scope,
		TracerProvider: tracerProvider,
		ResyncPeriod:   opts.resyncPeriod,
		Config: controller.Config{
			Owner:                   opts.owner,
			Cluster:                 cluster,
			SweepInterval:           opts.sweepInterval,
			SweepMaxDeletions:       opts.sweepMaxDeletions,
			SweepMaxDeletionPercent: opts.sweepMaxDeletionPercent,
			MaxRewinds:              opts.maxRewinds,
			HistoryRetention:        opts.historyRetention,
			SyncTimeout:             opts.syncTimeout,
			RateLimiter:             rateLimiter,
			SweepEventTarget:        podReference(),
			RegistryBehind:          registryBehind,
			Metrics:                 metrics,
			Leading:                 leading,
		},
	})
	if err != nil {
		return err
	}
	defer wiring.Shutdown()
	ctrl := wiring.Controller
	if keeper != nil {
		keeper.recorder, keeper.confirmed = wiring.Recorder, ctrl.SweepSoon
	}
	running.Store(ctrl)

	if opts.pprofAddr != "0" {
		profiling := &http.Server{Addr: opts.pprofAddr, Handler: pprofHandler(), ReadHeaderTimeout: 5 * time.Second}
		if err := listenAndServe(serveCtx, &servers, profiling, "pprof"); err != nil {
			return err
		}
	}
	if opts.metricsAddr != "0" {
		if err := serveMetrics(serveCtx, &servers, opts, cfg); err != nil {
			return err
		}
	}

	// The informers stop when run returns for any reason, a lost Lease included, not
	// only on a signal: Shutdown (deferred above, so run after this) waits for them.
	informersCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	wiring.Start(informersCtx)
	if opts.dryRun {
		if opts.leaderElect {
			logger.Info("Dry run: --leader-elect is ignored; taking the Lease would be a write")
		}
		return ctrl.RunDryRun(ctx, cmp.Or(opts.sweepInterval, time.Minute))
	}

	// Writing starts with the owner's write fence, held while the controller works and
	// given back when it stops: meanwhile another controller of the owner waits, and a
	// former writer's late write (a paused leader's, one that waited on a lock) is
	// rolled back.
	crds, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	work := func(ctx context.Context) error {
		// Nothing is written, the schema's migration included, while the served CRD
		// would drop a field of a write.
		if !waitForCRD(ctx, crds, &crdProblem) {
			return nil
		}
		ok, err := writable.Lead(ctx, opts.owner, cluster, func(held *registry.HeldError) {
			fenceHolder.Store(&held.Holder)
			metrics.ObserveFence(false, true)
		})
		fenceHolder.Store(nil)
		if !ok {
			metrics.ObserveFence(false, false)
			return err
		}
		metrics.ObserveFence(true, false)
		workCtx, stopWork := context.WithCancel(ctx)
		defer stopWork()
		fenceCtx, stopFence := context.WithCancel(context.WithoutCancel(ctx))
		defer stopFence()
		lost := make(chan error, 1)
		go func() {
			err := writable.Hold(fenceCtx)
			metrics.ObserveFence(false, false)
			if err != nil {
				stopWork()
			}
			lost <- err
		}()
		err = writable.CheckSchema(workCtx) // a newer version may have migrated it meanwhile
		if err == nil && keeper != nil {
			// The marks are compared before the first sweep; until a check succeeds
			// the sweep releases nothing.
			if err := keeper.checkAndKeep(workCtx); err != nil {
				logger.Error(err, "Cannot compare the registry's mark with the cluster's yet; the sweep releases nothing until it can",
					"configMap", klog.KRef(keeper.namespace, keeper.name))
			}
			go keeper.run(workCtx, writable.LeaseDuration()/3)
		}
		if err == nil {
			err = drained(workCtx, opts, func(ctx context.Context) error { return ctrl.Run(ctx, opts.workers) })
		}
		stopFence()
		if fenceErr := <-lost; fenceErr != nil {
			return fmt.Errorf("stopped writing: %w", fenceErr)
		}
		return err
	}
	if !opts.leaderElect {
		return work(ctx)
	}
	return runLeading(ctx, opts, wiring.KubeClient, wiring.Recorder, watchdog, gate, work)
}

// crdRetry is how often a controller that found the Student CRD too old reads it again.
const crdRetry = 10 * time.Second

// waitForCRD returns once the served Student CRD has every field the controller relies
// on (controller.CheckCRD); false when ctx ends first. Meanwhile problem says why the
// Pod is not ready.
func waitForCRD(ctx context.Context, client dynamic.Interface, problem *atomic.Pointer[string]) bool {
	logger := klog.FromContext(ctx)
	said := ""
	for {
		checkCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := controller.CheckCRD(checkCtx, client)
		cancel()
		if err == nil {
			problem.Store(nil)
			return true
		}
		if msg := err.Error(); msg != said && ctx.Err() == nil {
			logger.Error(err, "Writing nothing until the Student CRD serves every field this controller writes; retrying", "every", crdRetry)
			said = msg
			problem.Store(&msg)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(crdRetry):
		}
	}
}

// drained runs fn until ctx is done, and then waits for fn to drain, at most
// --shutdown-timeout.
func drained(ctx context.Context, opts options, fn func(context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(opts.shutdownTimeout):
		return fmt.Errorf("work still in flight %v after shutdown began; exiting anyway", opts.shutdownTimeout)
	}
}

// podReference names the controller's own Pod, from the downward API, so that
// controller-wide Events (a refused sweep) show on it; nil outside a cluster.
func podReference() *corev1.ObjectReference {
	name, namespace := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || namespace == "" {
		return nil
	}
	return &corev1.ObjectReference{
		APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: name, UID: types.UID(os.Getenv("POD_UID")),
	}
}

// open opens the registry: to write (writable; work makes it this controller's once it
// leads), or read-only for --dry-run (a dryRunRegistry; writable nil); and the cluster
// the controller works in, and what closes it. A nil registry and no error when ctx ends first.
func open(ctx context.Context, opts options, kubeClient kubernetes.Interface) (reg interface {
	controller.Registry
	String() string
}, writable *registry.Registry, cluster string, closeRegistry func() error, err error) {
	clusterOf := func(ctx context.Context) (string, error) {
		ctx, cancel := context.WithTimeout(ctx, opts.syncTimeout)
		defer cancel()
		return clusterID(ctx, kubeClient)
	}
	r, cluster, err := registry.Connect(ctx, opts.registry, opts.owner, clusterOf, registry.Options{
		ReadOnly:        opts.dryRun,
		Password:        opts.registryPassword(),
		MaxOpenConns:    opts.maxOpenConns,
		MaxIdleConns:    opts.maxIdleConns,
		ConnMaxLifetime: opts.connMaxLifetime,
		LeaseDuration:   opts.fenceLease,
		LockWait:        opts.lockWait,
	})
	switch {
	case err != nil || r == nil:
		return nil, nil, "", nil, err
	case opts.dryRun:
		return dryRunRegistry{r}, nil, cluster, r.Close, nil
	}
	return r, r, cluster, r.Close, nil
}

// clusterID names the cluster a client reaches: the UID of its kube-system namespace,
// which lives as long as the cluster does.
func clusterID(ctx context.Context, client kubernetes.Interface) (string, error) {
	ns, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the cluster's identity (the UID of namespace kube-system): %w", err)
	}
	return string(ns.UID), nil
}
