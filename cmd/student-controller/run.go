package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/metricsauth"
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
	if opts.leaderElect {
		watchdog = leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	}
	var running atomic.Pointer[controller.Controller]
	synced := func() bool { c := running.Load(); return c != nil && c.HasSynced() }
	if opts.probeAddr != "0" {
		probes := &http.Server{Addr: opts.probeAddr, Handler: probeHandler(synced, watchdog), ReadHeaderTimeout: 5 * time.Second}
		if err := listenAndServe(serveCtx, &servers, probes, "probes"); err != nil {
			return err
		}
	}

	reg, cluster, err := openRegistry(ctx, opts, kubeClient)
	if err != nil || reg == nil {
		return err // nil: stopped before the registry answered
	}
	defer reg.Close()
	logger.Info("Registry open", "registry", reg.String(), "owner", opts.owner)

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
	// With leader election the gate is the elector's; without, it always says yes.
	gate := &leaseGate{}
	wiring, err := controller.NewWiring(ctx, cfg, reg, controller.WiringOptions{
		Namespace:    opts.namespace,
		ResyncPeriod: opts.resyncPeriod,
		Config: controller.Config{
			Owner:                   opts.owner,
			Cluster:                 cluster,
			SweepInterval:           opts.sweepInterval,
			SweepMaxDeletions:       opts.sweepMaxDeletions,
			SweepMaxDeletionPercent: opts.sweepMaxDeletionPercent,
			SyncTimeout:             opts.syncTimeout,
			RateLimiter:             rateLimiter,
			SweepEventTarget:        podReference(),
			Metrics:                 metrics,
			Leading:                 gate.check,
		},
	})
	if err != nil {
		return err
	}
	defer wiring.Shutdown()
	ctrl := wiring.Controller
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

	// Writing starts with the owner's write fence: from then on a former writer's late
	// write (a paused leader's, one that waited on a lock) is rolled back.
	work := func(ctx context.Context) error {
		if !takeFence(ctx, reg, opts.owner) {
			return nil
		}
		return drained(ctx, opts, func(ctx context.Context) error { return ctrl.Run(ctx, opts.workers) })
	}
	if !opts.leaderElect {
		return work(ctx)
	}
	return runLeading(ctx, opts, wiring.KubeClient, wiring.Recorder, watchdog, gate, work)
}

// openRegistry opens the registry (migrating its schema, which may take long on a big
// table) and binds the owner to this cluster (bounded by --sync-timeout). While either
// is out of reach it retries with backoff; what retrying cannot fix ends it at once
// (see permanent). It returns a nil registry and no error when ctx ends first.
func openRegistry(ctx context.Context, opts options, kubeClient kubernetes.Interface) (*registry.Registry, string, error) {
	if err := registry.CheckURL(opts.registryURL); err != nil {
		return nil, "", err
	}
	var reg *registry.Registry
	var cluster string
	err := retry(ctx, "Registry or cluster identity not available yet; the Pod stays not ready and retries", permanent, func() error {
		r, err := registry.Open(ctx, opts.registryURL, registry.Options{
			Password:        opts.registryPassword(),
			MaxOpenConns:    opts.maxOpenConns,
			MaxIdleConns:    opts.maxIdleConns,
			ConnMaxLifetime: opts.connMaxLifetime,
		})
		if err != nil {
			return err
		}
		bindCtx, cancel := context.WithTimeout(ctx, opts.syncTimeout)
		defer cancel()
		if cluster, err = bindCluster(bindCtx, kubeClient, r, opts.owner); err != nil {
			return errors.Join(err, r.Close())
		}
		reg = r
		return nil
	})
	return reg, cluster, err
}

// retry calls attempt until it succeeds, fails for good (permanent, when given), or ctx
// ends, which is no error; between tries it logs what with the failure and waits, from
// 1 s doubling to 30 s.
func retry(ctx context.Context, what string, permanent func(error) bool, attempt func() error) error {
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Jitter: 0.1, Steps: math.MaxInt32, Cap: 30 * time.Second}
	for {
		err := attempt()
		switch {
		case err == nil:
			return nil
		case permanent != nil && permanent(err):
			return err
		case ctx.Err() != nil:
			return nil
		}
		delay := backoff.Step()
		klog.FromContext(ctx).Error(err, what, "in", delay.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// permanent tells the errors of opening that no retry fixes, so the process ends and
// says why instead of waiting unready: the owner bound to another cluster, a schema
// newer than this program, a server certificate that does not verify. RBAC that does
// not yet let it read the cluster's identity is waited for: an install applies the
// Deployment and its bindings in no set order.
func permanent(err error) bool {
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	return errors.Is(err, registry.ErrOtherCluster) || errors.Is(err, registry.ErrSchemaNewer) ||
		errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid)
}

// takeFence takes the registry owner's write fence, retrying while the registry fails;
// false when ctx ends first.
func takeFence(ctx context.Context, reg *registry.Registry, owner string) bool {
	var token int64
	_ = retry(ctx, "Cannot take the registry owner's write fence; retrying", nil, func() (err error) {
		token, err = reg.TakeFence(ctx, owner)
		return err
	})
	if token == 0 {
		return false
	}
	klog.FromContext(ctx).Info("Took the registry owner's write fence", "owner", owner, "token", token)
	return true
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

// bindCluster binds the owner to this cluster in the registry on first use, and
// refuses to go on when the registry binds it to another: a wrong kubeconfig would
// otherwise make every row look like an orphan.
func bindCluster(ctx context.Context, client kubernetes.Interface, reg *registry.Registry, owner string) (string, error) {
	cluster, err := clusterID(ctx, client)
	if err != nil {
		return "", err
	}
	b, err := reg.Bind(ctx, owner, cluster)
	if errors.Is(err, registry.ErrOtherCluster) {
		return "", fmt.Errorf("%w. Writing nothing: check --kubeconfig and --registry. If the owner's rows really are to follow "+
			"this cluster now (a rebuilt cluster, a registry moved), move the owner explicitly, with this kubeconfig: "+
			"student-controller registry move-cluster --registry-owner %s --from %s (and the same --registry and --kubeconfig)",
			err, owner, b.Cluster)
	}
	if err != nil {
		return "", err
	}
	klog.FromContext(ctx).Info("Registry owner bound to this cluster", "owner", owner, "cluster", cluster, "since", b.BoundAt)
	return cluster, nil
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

// runLeading runs fn only while this process holds the Lease. On shutdown it lets fn
// drain first and then releases the Lease, so a standby takes over at once and never
// overlaps with this process's last writes.
func runLeading(ctx context.Context, opts options, kubeClient kubernetes.Interface, recorder record.EventRecorder,
	watchdog *leaderelection.HealthzAdaptor, gate *leaseGate, fn func(context.Context) error) error {
	logger := klog.FromContext(ctx)
	host, _ := os.Hostname()
	id := host + "_" + uuid.NewString()
	ns := opts.leaderElectNamespace
	if ns == "" {
		ns = os.Getenv("POD_NAMESPACE")
	}
	if ns == "" {
		ns = "kube-system"
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, ns, opts.leaderElectID,
		kubeClient.CoreV1(), kubeClient.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: id, EventRecorder: recorder})
	if err != nil {
		return fmt.Errorf("leader election lock: %w", err)
	}

	// The elector's context outlives ctx until fn has drained.
	electorCtx, stopElector := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElector()
	var fnErr error
	fnDone := make(chan struct{})
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		Name:            controller.Name,
		LeaseDuration:   opts.leaseDuration,
		RenewDeadline:   opts.renewDeadline,
		RetryPeriod:     opts.retryPeriod,
		ReleaseOnCancel: true,
		WatchDog:        watchdog,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(leading context.Context) {
				logger.Info("Became the leader", "lease", klog.KRef(ns, opts.leaderElectID), "identity", id)
				runCtx, cancel := context.WithCancel(ctx)
				defer cancel()
				defer context.AfterFunc(leading, cancel)()
				fnErr = fn(runCtx)
				close(fnDone)
				// fn ended on its own (fenced, the owner moved): no leader that does
				// nothing; the Lease goes, and the process exits with fn's error.
				stopElector()
			},
			OnStoppedLeading: func() { logger.Info("Stopped leading", "identity", id) },
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Another replica leads; standing by", "leader", identity)
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("leader election: %w", err)
	}
	gate.set(elector, opts.renewDeadline-opts.leaseDuration)
	go func() {
		<-ctx.Done()
		if elector.IsLeader() {
			<-fnDone
		}
		stopElector()
	}()
	elector.Run(electorCtx)

	select {
	case <-fnDone:
		if fnErr != nil {
			return fnErr
		}
	default:
	}
	if ctx.Err() == nil {
		// The Lease was lost while still wanted: another replica may already be writing.
		return errors.New("lost the leader election Lease")
	}
	select {
	case <-fnDone:
		return fnErr
	default:
		return nil
	}
}

// serveMetrics serves the Prometheus registry: plain HTTP, or with --metrics-secure
// HTTPS where the API server authenticates and authorizes each caller.
func serveMetrics(ctx context.Context, wg *sync.WaitGroup, opts options, cfg *rest.Config) error {
	mo := metricsserver.Options{BindAddress: opts.metricsAddr, SecureServing: opts.metricsSecure,
		// Uncompressed: a scrape is some tens of KiB, and gzip would keep a compressor of
		// about 1.5 MiB in memory from one scrape to the next.
		HandlerOpts: []func(*promhttp.HandlerOpts){func(o *promhttp.HandlerOpts) { o.DisableCompression = true }},
	}
	if opts.metricsSecure {
		mo.FilterProvider = func(c *rest.Config, hc *http.Client) (metricsserver.Filter, error) {
			client, err := kubernetes.NewForConfigAndClient(c, hc)
			if err != nil {
				return nil, err
			}
			filter := metricsauth.New(client)
			return func(_ logr.Logger, h http.Handler) (http.Handler, error) { return filter.Wrap(h), nil }, nil
		}
	}
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return fmt.Errorf("metrics server client: %w", err)
	}
	srv, err := metricsserver.NewServer(mo, cfg, httpClient)
	if err != nil {
		return fmt.Errorf("metrics server: %w", err)
	}
	wg.Go(func() {
		if err := srv.Start(ctx); err != nil {
			utilruntime.HandleErrorWithContext(ctx, err, "Metrics server stopped")
		}
	})
	return nil
}

// listenAndServe binds srv's address now, so that a taken port fails the start, and
// serves until ctx is done.
func listenAndServe(ctx context.Context, wg *sync.WaitGroup, srv *http.Server, what string) error {
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	klog.FromContext(ctx).Info("Serving", "what", what, "address", ln.Addr().String())
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			utilruntime.HandleErrorWithContext(ctx, err, "Server stopped", "what", what)
		}
	})
	wg.Go(func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	})
	return nil
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

// leaseGate tells the controller whether this replica may still write (its
// Config.Leading). client-go's elector stands down only once a renewal has failed, and a
// leader paused past its Lease (SIGSTOP, a frozen VM) learns that only after it resumes
// and tries: measured, about 10 s of acting on a cache as old as the pause, while
// another replica leads. The gate closes as soon as the last renewal is older than the
// renew deadline, before any write, whether or not the elector has noticed.
type leaseGate struct {
	elector atomic.Pointer[leaderelection.LeaderElector]
	// slack is what Check may add to the lease duration: renew deadline minus lease
	// duration, so the gate closes at the renew deadline.
	slack time.Duration
}

func (g *leaseGate) set(e *leaderelection.LeaderElector, slack time.Duration) {
	g.slack = slack
	g.elector.Store(e)
}

// check is nil while writes may go ahead. Without leader election (no elector) they
// always may.
func (g *leaseGate) check() error {
	e := g.elector.Load()
	switch {
	case e == nil:
		return nil
	case !e.IsLeader():
		return errors.New("another replica holds the Lease")
	}
	return e.Check(g.slack)
}
