package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/leader"
	"github.com/student-controller/student-controller/internal/mark"
	"github.com/student-controller/student-controller/internal/registry"
)

// run builds every dependency, serves probes and metrics, and runs the controller
// (while it leads, with --leader-elect) until ctx is done; then it drains and returns.
func run(ctx context.Context, opts options) error {
	klog.FromContext(ctx).Info("Starting", "version", versionString())
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
	// Probes first: with the registry out of reach the Pod is unready, not crash-looping.
	var watchdog *leaderelection.HealthzAdaptor
	if opts.leaderElect && !opts.dryRun {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	probes := &readiness{owner: opts.owner}
	if err := listenAndServe(serveCtx, &servers, opts.probeAddr, probeHandler(probes.ready, watchdog), "probes"); err != nil {
		return err
	}

	reg, writable, cluster, closeRegistry, err := open(ctx, opts, kubeClient)
	if err != nil || reg == nil {
		return err // nil: stopped before the registry answered
	}
	defer closeRegistry()
	klog.FromContext(ctx).Info("Registry open", "registry", reg.String(), "owner", opts.owner, "readOnly", opts.dryRun, "scope", opts.scope.String())

	metrics := startMetrics()
	keeper := newKeeper(ctx, opts, kubeClient, writable, metrics)
	gate := &leader.Gate{}
	wiring, stopTracing, err := startController(ctx, opts, cfg, reg, cluster, metrics, keeper, gate)
	if err != nil {
		return err
	}
	defer stopTracing()
	defer wiring.Shutdown()
	ctrl := wiring.Controller
	if keeper != nil {
		keeper.Recorder, keeper.Sweeper = wiring.Recorder, ctrl
		probes.keeper.Store(keeper)
	}
	probes.ctrl.Store(ctrl)
	if err := listenAndServe(serveCtx, &servers, opts.pprofAddr, pprofHandler(), "pprof"); err != nil {
		return err
	}
	if err := serveMetrics(serveCtx, &servers, opts, cfg); err != nil {
		return err
	}

	// The informers stop when run returns, a lost Lease too; the deferred Shutdown waits.
	informersCtx, stopInformers := context.WithCancel(ctx)
	defer stopInformers()
	wiring.Start(informersCtx)
	if opts.dryRun {
		if opts.leaderElect {
			klog.FromContext(ctx).Info("Dry run: --leader-elect is ignored; taking the Lease would be a write")
		}
		return ctrl.RunDryRun(ctx, cmp.Or(opts.sweepInterval, time.Minute))
	}
	crds, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	w := &writer{opts: opts, reg: writable, cluster: cluster, crds: crds, ctrl: ctrl, keeper: keeper, metrics: metrics, probes: probes}
	if !opts.leaderElect {
		return w.work(ctx)
	}
	return leader.Run(ctx, leader.Config{
		Namespace: cmp.Or(opts.leaderElectNamespace, os.Getenv("POD_NAMESPACE"), metav1.NamespaceSystem), Name: opts.leaderElectID,
		Client: wiring.KubeClient, Recorder: wiring.Recorder, Watchdog: watchdog, Gate: gate,
		LeaseDuration: opts.leaseDuration, RenewDeadline: opts.renewDeadline, RetryPeriod: opts.retryPeriod,
	}, w.work)
}

// readiness is what /readyz checks: the controller, the fence holder, the CRD, the keeper.
type readiness struct {
	owner                   string
	ctrl                    atomic.Pointer[controller.Controller]
	fenceHolder, crdProblem atomic.Pointer[string]
	keeper                  atomic.Pointer[mark.Keeper]
}

func (r *readiness) ready() error {
	c := r.ctrl.Load()
	if c == nil || !c.HasSynced() {
		return errors.New("the Student cache has not synced")
	}
	if err := c.CRDOlder(); err != nil {
		return err
	}
	if problem := r.crdProblem.Load(); problem != nil {
		return errors.New(*problem)
	}
	if holder := r.fenceHolder.Load(); holder != nil {
		return fmt.Errorf("another controller of owner %q holds the registry's write fence: %s", r.owner, *holder)
	}
	if k := r.keeper.Load(); k != nil {
		return k.Ready()
	}
	return nil
}

// startMetrics adds process, Go, workqueue and controller metrics to controller-runtime's
// registry, beside client-go's.
func startMetrics() *controller.Metrics {
	crmetrics.Registry.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	workqueue.SetProvider(controller.NewWorkqueueMetricsProvider(crmetrics.Registry))
	return controller.NewMetrics(crmetrics.Registry)
}

// newKeeper is the keeper of the registry's mark: nil in a dry run or with no namespace.
func newKeeper(ctx context.Context, opts options, client kubernetes.Interface, reg *registry.Registry, metrics *controller.Metrics) *mark.Keeper {
	place := markPlace(opts)
	switch {
	case opts.dryRun:
		return nil
	case place.Namespace == "":
		klog.FromContext(ctx).Info("The registry's mark is not kept in the cluster: with no namespace for it (--registry-mark-namespace, POD_NAMESPACE), " +
			"a registry put back in time is not noticed")
		return nil
	}
	return &mark.Keeper{Client: client, Place: place, Owner: opts.owner, Registry: reg, Gauge: metrics, Pod: podReference()}
}

// startController makes the controller, its informers and its tracing's stop; gate is the
// elector's (open without election).
func startController(ctx context.Context, opts options, cfg *rest.Config, reg controller.Registry, cluster string,
	metrics *controller.Metrics, keeper *mark.Keeper, gate *leader.Gate) (*controller.Wiring, func(), error) {
	rateLimiter := controller.DefaultRateLimiter()
	if opts.rateLimiter == "client-go" {
		rateLimiter = workqueue.DefaultTypedControllerRateLimiter[string]()
	}
	var leading controller.Gate = gate
	if opts.dryRun {
		leading = dryRunGate{}
	}
	var registryMark controller.Mark
	if keeper != nil {
		registryMark = keeper
	}
	tracerProvider, stopTracing, err := startTracing(ctx, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("--tracing-endpoint: %w", err)
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
			Mark:                    registryMark,
			Metrics:                 metrics,
			Leading:                 leading,
		},
	})
	if err != nil {
		stopTracing()
		return nil, nil, err
	}
	return wiring, stopTracing, nil
}

// writer is the controller's work once it may write.
type writer struct {
	opts    options
	reg     *registry.Registry
	cluster string
	crds    dynamic.Interface
	ctrl    *controller.Controller
	keeper  *mark.Keeper
	metrics *controller.Metrics
	probes  *readiness
}

// work writes until ctx ends, holding the owner's write fence throughout: another
// controller of the owner waits meanwhile, and a late write of a former writer (a paused
// leader, one that waited on a lock) is rolled back.
func (w *writer) work(ctx context.Context) error {
	// Write nothing, not even the migration, while the served CRD would drop a field.
	if !waitForCRD(ctx, w.crds, &w.probes.crdProblem) {
		return nil
	}
	ok, err := w.reg.Lead(ctx, w.opts.owner, w.cluster, func(held *registry.HeldError) {
		w.probes.fenceHolder.Store(&held.Holder)
		w.metrics.ObserveFence(false, true)
	})
	w.probes.fenceHolder.Store(nil)
	if w.metrics.ObserveFence(ok, false); !ok {
		return err
	}
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	fenceCtx, stopFence := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFence()
	lost := make(chan error, 1)
	go func() {
		err := w.reg.Hold(fenceCtx)
		w.metrics.ObserveFence(false, false)
		if err != nil {
			stopWork()
		}
		lost <- err
	}()
	err = w.reg.CheckSchema(workCtx) // a newer version may have migrated it meanwhile
	if err == nil {
		w.startKeeper(workCtx)
		err = drained(workCtx, w.opts, func(ctx context.Context) error { return w.ctrl.Run(ctx, w.opts.workers) })
	}
	stopFence()
	if fenceErr := <-lost; fenceErr != nil {
		return fmt.Errorf("stopped writing: %w", fenceErr)
	}
	return err
}

// startKeeper checks the marks before the first sweep, then keeps the mark until ctx ends.
func (w *writer) startKeeper(ctx context.Context) {
	if w.keeper == nil {
		return
	}
	if err := w.keeper.Check(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Cannot compare the registry's mark with the cluster's yet; the sweep releases nothing until it can",
			"configMap", klog.KRef(w.keeper.Place.Namespace, w.keeper.Place.Name))
	}
	go w.keeper.Run(ctx, w.reg.LeaseDuration()/3)
}

// dryRunGate refuses every write: a dry run writes nothing.
type dryRunGate struct{}

func (dryRunGate) Check() error { return errDryRun }

// markPlace is the mark's ConfigMap (see --registry-mark-namespace), named after the Lease
// so the Lease's RBAC names it too.
func markPlace(opts options) mark.Place {
	namespace := cmp.Or(opts.markNamespace, opts.leaderElectNamespace, os.Getenv("POD_NAMESPACE"))
	if namespace == "" && opts.leaderElect {
		namespace = metav1.NamespaceSystem
	}
	return mark.Place{Namespace: namespace, Name: opts.leaderElectID + mark.Suffix, Given: opts.markNamespace != ""}
}

// crdRetry is how often a controller that found the Student CRD too old reads it again.
const crdRetry = 10 * time.Second

// waitForCRD waits until the served CRD has every field the controller needs (false if ctx
// ends); problem says why not.
func waitForCRD(ctx context.Context, client dynamic.Interface, problem *atomic.Pointer[string]) bool {
	logger, said := klog.FromContext(ctx), ""
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

// drained runs fn until ctx is done, then waits at most --shutdown-timeout for it to drain.
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

// podReference is the controller's own Pod (downward API), for controller-wide Events.
func podReference() *corev1.ObjectReference {
	name, namespace := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || namespace == "" {
		return nil
	}
	return &corev1.ObjectReference{
		APIVersion: "v1", Kind: "Pod", Namespace: namespace, Name: name, UID: types.UID(os.Getenv("POD_UID")),
	}
}

// open opens the registry, read-only as a dryRunRegistry for --dry-run (writable nil); nil
// and no error if ctx ends first.
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

// clusterID is the UID of kube-system, which lives as long as the cluster does.
func clusterID(ctx context.Context, client kubernetes.Interface) (string, error) {
	ns, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("read the cluster's identity (the UID of namespace kube-system): %w", err)
	}
	return string(ns.UID), nil
}
