// Command student-controller keeps a student registry (a SQL database) in line with
// the Student objects of a Kubernetes cluster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	_ "modernc.org/sqlite" // the SQLite driver for sqlite: registry URLs

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
	studentscheme "github.com/student-controller/student-controller/pkg/generated/clientset/versioned/scheme"
	"github.com/student-controller/student-controller/pkg/generated/informers/externalversions"
)

// options are the command-line flags.
type options struct {
	kubeconfig        string
	master            string
	namespace         string
	qps               float64
	burst             int
	workers           int
	registryURL       string
	owner             string
	sweepInterval     time.Duration
	sweepMaxDeletions int
	resyncPeriod      time.Duration
	syncTimeout       time.Duration
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Path to a kubeconfig. Only required if out-of-cluster.")
	fs.StringVar(&o.master, "master", "", "The address of the Kubernetes API server. Overrides any value in kubeconfig. Only required if out-of-cluster.")
	fs.StringVar(&o.namespace, "namespace", "", "Only watch Students in this namespace. All namespaces when empty.")
	fs.Float64Var(&o.qps, "kube-api-qps", 100, "Queries per second to the API server, sustained.")
	fs.IntVar(&o.burst, "kube-api-burst", 200, "Queries to the API server in a burst.")
	fs.IntVar(&o.workers, "workers", 8, "Students synced in parallel.")
	fs.StringVar(&o.registryURL, "registry", "sqlite:student-registry.db",
		"The student registry: sqlite:///ABSOLUTE/PATH.db, or sqlite:RELATIVE/PATH.db (relative to the working directory).")
	fs.StringVar(&o.owner, "registry-owner", "student-controller",
		"Owner mark on the registry rows this controller writes. It never changes or deletes rows with another owner.")
	fs.DurationVar(&o.sweepInterval, "sweep-interval", 5*time.Minute,
		"How often to compare the whole registry with the Students, repair drift and delete orphan rows. 0 turns it off.")
	fs.IntVar(&o.sweepMaxDeletions, "sweep-max-deletions", 100,
		"A sweep that would delete more orphan rows than this deletes none and reports it.")
	fs.DurationVar(&o.resyncPeriod, "resync-period", 10*time.Minute, "How often every Student is synced again even without a change.")
	fs.DurationVar(&o.syncTimeout, "sync-timeout", 30*time.Second, "Time limit of one sync; also bounds the drain on shutdown.")
}

func (o *options) validate() error {
	var errs []error
	if o.workers < 1 {
		errs = append(errs, fmt.Errorf("--workers must be at least 1, got %d", o.workers))
	}
	if o.qps <= 0 || o.burst < 1 {
		errs = append(errs, fmt.Errorf("--kube-api-qps and --kube-api-burst must be positive, got %v and %d", o.qps, o.burst))
	}
	if o.owner == "" {
		errs = append(errs, errors.New("--registry-owner must not be empty"))
	}
	if o.sweepInterval < 0 || o.sweepMaxDeletions < 0 || o.resyncPeriod < 0 || o.syncTimeout <= 0 {
		errs = append(errs, errors.New("--sweep-interval, --sweep-max-deletions and --resync-period must not be negative, --sync-timeout must be positive"))
	}
	return errors.Join(errs...)
}

func main() {
	klog.InitFlags(nil)
	var opts options
	opts.addFlags(flag.CommandLine)
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "unexpected arguments: %q\n", flag.Args())
		os.Exit(2)
	}
	if err := opts.validate(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

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

// run builds every dependency, runs the controller until ctx is done, and drains.
func run(ctx context.Context, opts options) error {
	logger := klog.FromContext(ctx)

	cfg, err := clientcmd.BuildConfigFromFlags(opts.master, opts.kubeconfig)
	if err != nil {
		return fmt.Errorf("build client config: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(opts.qps), opts.burst
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " " + controller.Name
	kubeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("build Kubernetes client: %w", err)
	}
	studentClient, err := versioned.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("build Student client: %w", err)
	}

	reg, err := registry.Open(ctx, opts.registryURL, registry.Options{})
	if err != nil {
		return err
	}
	defer reg.Close()
	logger.Info("Registry open", "registry", reg.String(), "owner", opts.owner)

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(studentscheme.AddToScheme(scheme))
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartStructuredLogging(4)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kubeClient.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: controller.Name})

	factory := externalversions.NewSharedInformerFactoryWithOptions(studentClient, opts.resyncPeriod,
		externalversions.WithNamespace(opts.namespace))
	ctrl, err := controller.New(ctx, studentClient, factory.Bolingcavalry().V1().Students(), reg, recorder, controller.Config{
		Owner:             opts.owner,
		SweepInterval:     opts.sweepInterval,
		SweepMaxDeletions: opts.sweepMaxDeletions,
		SyncTimeout:       opts.syncTimeout,
		SweepEventTarget:  podReference(),
	})
	if err != nil {
		return err
	}

	factory.Start(ctx.Done())
	defer factory.Shutdown()
	return ctrl.Run(ctx, opts.workers)
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
