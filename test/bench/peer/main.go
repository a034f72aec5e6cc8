// Command peer is the benchmark's contender written the way a kubebuilder user would:
// a controller-runtime reconciler, with controller-runtime's defaults (one concurrent
// reconcile, the default cache, the default client rate limits), doing the same work
// as student-controller through the same registry package: finalizer, registry row,
// Ready condition, delete handling.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	_ "modernc.org/sqlite"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

const finalizer = "bolingcavalry.k8s.io/registry-row"

// StudentReconciler reconciles Students into the registry.
type StudentReconciler struct {
	client.Client
	Registry *registry.Registry
	Owner    string
}

// Reconcile is the kubebuilder-style reconcile loop.
func (r *StudentReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var s studentv1.Student
	if err := r.Get(ctx, req.NamespacedName, &s); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}

	rec := registry.Record{
		UID: string(s.UID), Namespace: s.Namespace, Name: s.Name,
		StudentName: s.Spec.Name, School: s.Spec.School, Owner: r.Owner, Generation: s.Generation,
	}
	if !s.DeletionTimestamp.IsZero() {
		if controllerutil.ContainsFinalizer(&s, finalizer) {
			var err error
			if s.Spec.DeletionPolicy == studentv1.DeletionPolicyOrphan {
				_, err = r.Registry.Release(ctx, rec, registry.CauseFinalizer)
			} else {
				_, err = r.Registry.Delete(ctx, string(s.UID), r.Owner, registry.CauseFinalizer)
			}
			if err != nil && !errors.Is(err, registry.ErrNotOwned) {
				return ctrl.Result{}, err
			}
			controllerutil.RemoveFinalizer(&s, finalizer)
			if err := r.Update(ctx, &s); err != nil {
				return ctrl.Result{}, err
			}
		}
		return ctrl.Result{}, nil
	}

	if controllerutil.AddFinalizer(&s, finalizer) {
		if err := r.Update(ctx, &s); err != nil {
			return ctrl.Result{}, err
		}
	}

	row, err := r.Registry.Upsert(ctx, rec, registry.Why{Cause: registry.CauseSpecChange})
	cond := metav1.Condition{Type: studentv1.ConditionReady, Status: metav1.ConditionTrue, Reason: studentv1.ReasonSynced,
		Message: "The registry row matches the spec", ObservedGeneration: s.Generation}
	if err != nil {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, studentv1.ReasonRegistryUnavailable, err.Error()
	}
	changed := meta.SetStatusCondition(&s.Status.Conditions, cond)
	if s.Status.ObservedGeneration != s.Generation {
		s.Status.ObservedGeneration, changed = s.Generation, true
	}
	if err == nil && (s.Status.Registry == nil || s.Status.Registry.WrittenGeneration != row.Generation) {
		written := metav1.NewTime(row.UpdatedAt)
		s.Status.Registry = &studentv1.RegistryStatus{Owner: r.Owner, LastWrittenTime: &written, WrittenGeneration: row.Generation}
		changed = true
	}
	if changed {
		if uerr := r.Status().Update(ctx, &s); uerr != nil {
			return ctrl.Result{}, uerr
		}
	}
	return ctrl.Result{}, err
}

func main() {
	// controller-runtime registers --kubeconfig itself.
	var registryURL, namespace, metricsAddr, probeAddr string
	flag.StringVar(&registryURL, "registry", "", "registry URL")
	flag.StringVar(&namespace, "namespace", "", "namespace to watch")
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "metrics address")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "probe address")
	klog.InitFlags(nil)
	flag.Parse()
	ctrl.SetLogger(klog.NewKlogr())

	if err := run(registryURL, namespace, metricsAddr, probeAddr); err != nil {
		fmt.Fprintln(os.Stderr, "peer:", err)
		os.Exit(1)
	}
}

func run(registryURL, namespace, metricsAddr, probeAddr string) error {
	// controller-runtime's own loader, with its defaults: it turns client-side rate
	// limiting off and leaves the server's Priority and Fairness to pace it.
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return err
	}

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(studentv1.AddToScheme(scheme))

	ctx := ctrl.SetupSignalHandler()
	reg, err := registry.Open(ctx, registryURL, registry.Options{})
	if err != nil {
		return err
	}
	defer reg.Close()

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{namespace: {}}},
	})
	if err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("cache", func(req *http.Request) error {
		if !mgr.GetCache().WaitForCacheSync(req.Context()) {
			return errors.New("cache not synced")
		}
		return nil
	}); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).For(&studentv1.Student{}).Named("student").
		Complete(&StudentReconciler{Client: mgr.GetClient(), Registry: reg, Owner: "peer"}); err != nil {
		return err
	}
	return mgr.Start(ctx)
}
