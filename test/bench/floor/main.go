// Command floor is the benchmark's lower bound: a bare client that performs only the
// API writes a controller must make per Student (add the finalizer when it is missing,
// write a Ready status), with no informer, no cache and no registry, at student-controller's client
// settings and concurrency. It lists the Students once, then learns of new ones from a
// watch that client-go's RetryWatcher resumes whenever the API server ends it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/klog/v2"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

const finalizer = "bolingcavalry.k8s.io/registry-row"

func main() {
	var kubeconfig, namespace, metricsAddr string
	var qps float64
	var burst, workers int
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig")
	flag.StringVar(&namespace, "namespace", "", "namespace to watch")
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "metrics address")
	flag.Float64Var(&qps, "kube-api-qps", 100, "client QPS")
	flag.IntVar(&burst, "kube-api-burst", 200, "client burst")
	flag.IntVar(&workers, "workers", 8, "concurrent writers")
	flag.Parse()
	if err := run(kubeconfig, namespace, metricsAddr, qps, burst, workers); err != nil {
		fmt.Fprintln(os.Stderr, "floor:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, metricsAddr string, qps float64, burst, workers int) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(qps), burst
	client, err := versioned.NewForConfig(cfg)
	if err != nil {
		return err
	}
	students := client.BolingcavalryV1().Students(namespace)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// The same client metrics as the other contenders (controller-runtime's registry
	// carries client-go's request counts).
	go func() {
		srv := &http.Server{Addr: metricsAddr, Handler: promhttp.HandlerFor(crmetrics.Registry, promhttp.HandlerOpts{}), ReadHeaderTimeout: 10 * time.Second}
		_ = srv.ListenAndServe()
	}()

	list, err := students.List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return students.Watch(ctx, opts)
		},
	})
	if err != nil {
		return err
	}
	defer w.Stop()
	work := make(chan *studentv1.Student, 100000)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for s := range work {
				if err := handle(ctx, client, s); err != nil && ctx.Err() == nil {
					klog.ErrorS(err, "write failed", "student", klog.KObj(s))
				}
			}
		})
	}
	defer wg.Wait()
	defer close(work)
	for i := range list.Items {
		if s := &list.Items[i]; wants(watch.Added, s) {
			work <- s
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.ResultChan():
			if !ok {
				return errors.New("the watch of Students ended")
			}
			if e.Type == watch.Error {
				return fmt.Errorf("watch of Students: %v", apierrors.FromObject(e.Object))
			}
			if s, isStudent := e.Object.(*studentv1.Student); isStudent && wants(e.Type, s) {
				work <- s
			}
		}
	}
}

// wants says whether an event needs a write: a new Student gets the finalizer and a
// status, a deleted one lets it go.
func wants(t watch.EventType, s *studentv1.Student) bool {
	if s.DeletionTimestamp != nil {
		return t != watch.Deleted && slices.Contains(s.Finalizers, finalizer)
	}
	return t == watch.Added
}

// handle makes the writes of a new Student, the finalizer (unless it was created with
// it) then the status, or the one of a deleted Student, the finalizer's removal.
func handle(ctx context.Context, client versioned.Interface, s *studentv1.Student) error {
	students := client.BolingcavalryV1().Students(s.Namespace)
	s = s.DeepCopy()
	if s.DeletionTimestamp != nil {
		s.Finalizers = slices.DeleteFunc(s.Finalizers, func(f string) bool { return f == finalizer })
		_, err := students.Update(ctx, s, metav1.UpdateOptions{})
		return err
	}
	updated := s
	if !slices.Contains(s.Finalizers, finalizer) {
		s.Finalizers = append(s.Finalizers, finalizer)
		var err error
		if updated, err = students.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	updated.Status.ObservedGeneration = updated.Generation
	updated.Status.Conditions = []metav1.Condition{{
		Type: studentv1.ConditionReady, Status: metav1.ConditionTrue, Reason: studentv1.ReasonSynced,
		ObservedGeneration: updated.Generation, LastTransitionTime: metav1.Now(), Message: "floor",
	}}
	_, err := students.UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	return err
}
