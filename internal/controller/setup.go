package controller

import (
	"context"
	"fmt"
	"go.opentelemetry.io/otel/trace"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
	studentscheme "github.com/student-controller/student-controller/pkg/generated/clientset/versioned/scheme"
)

// Wiring is a Controller with its clients, Event recorder and informers. NewWiring is the
// one place that builds them, for the binary and the tests alike.
type Wiring struct {
	KubeClient kubernetes.Interface // reaches the built-in APIs (Events, the leader election Lease)
	Recorder   record.EventRecorder // posts Events through KubeClient
	Controller *Controller          // the Student controller, not yet running

	informers   *Informers
	broadcaster record.EventBroadcaster
	crd         *crdWatch
	crdRunning  sync.WaitGroup
}

// WiringOptions say what the Controller watches, on top of its Config.
type WiringOptions struct {
	Scope          Scope                // limits the Controller to some namespaces and labels; all when zero
	TracerProvider trace.TracerProvider // when set, traces each sync (Config.Tracer) and its API requests
	ResyncPeriod   time.Duration        // replays every cached Student this often; 0 never
	Config         Config               // tunes the Controller
}

// NewWiring builds the clients, Event recorder, informers and the Controller over reg. It
// starts only the recorder: call Start, then Controller.Run, and Shutdown when done.
func NewWiring(ctx context.Context, restConfig *rest.Config, reg Registry, opts WiringOptions) (*Wiring, error) {
	cfg := rest.CopyConfig(restConfig)
	cfg.UserAgent = rest.DefaultKubernetesUserAgent() + " " + Name
	config := opts.Config
	if opts.TracerProvider != nil {
		cfg.Wrap(tracedTransport(opts.TracerProvider))
		config.Tracer = opts.TracerProvider.Tracer(TracerName)
	}
	kubeClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build Kubernetes client: %w", err)
	}
	studentClient, err := versioned.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build Student client: %w", err)
	}
	metaClient, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build metadata client: %w", err)
	}
	dynamicClient, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("build dynamic client: %w", err)
	}
	if config.CRDDeleting == nil {
		config.CRDDeleting = crdDeleting(metaClient)
	}
	w := &Wiring{KubeClient: kubeClient, informers: NewInformers(studentClient, opts.Scope, opts.ResyncPeriod)}
	w.broadcaster, w.Recorder = NewEventRecorder(ctx, kubeClient.CoreV1())
	config.Scope = opts.Scope // the sweep's scope is the watch's
	w.Controller, err = New(ctx, studentClient, w.informers, reg, w.Recorder, config)
	if err != nil {
		w.broadcaster.Shutdown()
		return nil, err
	}
	w.crd = newCRDWatch(dynamicClient)
	w.crd.current = w.Controller.syncAll
	w.Controller.crd = w.crd
	return w, nil
}

var crdName = "students." + studentv1.SchemeGroupVersion.Group

// crdDeleting returns Config.CRDDeleting: a GET of the CRD's metadata by each finalizer
// that would delete a row, since the API server marks the CRD deleted just before it
// deletes its Students. A CRD applied again is a new object: its rows are deleted again.
func crdDeleting(client metadata.Interface) func(context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		crd, err := client.Resource(crdResource).Get(ctx, crdName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return true, nil // gone: its Students go with it
		case err != nil:
			return false, err
		}
		return crd.DeletionTimestamp != nil, nil
	}
}

// Start starts the informers, on every replica, so a standby takes over with a warm cache.
func (w *Wiring) Start(ctx context.Context) {
	w.informers.Start(ctx.Done())
	w.crdRunning.Go(func() { w.crd.informer.RunWithContext(ctx) })
}

// Shutdown waits for the informers (after Start's ctx is done) and stops the recorder.
func (w *Wiring) Shutdown() {
	w.informers.Shutdown()
	w.crdRunning.Wait()
	w.broadcaster.Shutdown()
}

// eventCacheSize is how many recent Events each of the correlator's three caches keeps.
// Repeats come from the few objects that fail again and again, and 512 cover those;
// client-go's 4096 would hold megabytes (bench/results/history.md).
const eventCacheSize = 512

// NewEventRecorder starts a broadcaster posting Events through client (logged at -v=4) and
// returns it with a recorder for Students, the Lease and references; shut it down after.
func NewEventRecorder(ctx context.Context, client typedcorev1.EventsGetter) (record.EventBroadcaster, record.EventRecorder) {
	// Only the kinds Events are posted on: client-go's full scheme would be a second copy.
	scheme := runtime.NewScheme()
	utilruntime.Must(studentscheme.AddToScheme(scheme))
	utilruntime.Must(coordinationv1.AddToScheme(scheme))

	broadcaster := record.NewBroadcaster(record.WithContext(ctx),
		record.WithCorrelatorOptions(record.CorrelatorOptions{LRUCacheSize: eventCacheSize}))
	broadcaster.StartStructuredLogging(4)
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.Events("")})
	return broadcaster, broadcaster.NewRecorder(scheme, corev1.EventSource{Component: Name})
}
