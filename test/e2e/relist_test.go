package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// TestRelist: the controller's watch ends and, when it comes back, its resource version
// has been compacted away: the API server answers 410 Gone ("too old resource version")
// and the informer must list again. Students created, changed and deleted while it was
// away all converge, and the deletes made in the gap are finalized (rows deleted, or
// released for Orphan).
//
// It runs on a control plane of its own, with the watch cache off (watches are served
// from etcd, which has compacted the old revisions) and the API server compacting etcd
// every second. The controller's connection is cut by its own transport: running
// watches are closed and new ones refused until the test lets them through.
func TestRelist(t *testing.T) {
	t.Parallel()
	cp := controlplane.ForTest(t, controlplane.Options{APIServerFlags: map[string]string{
		"watch-cache":              "false",
		"etcd-compaction-interval": "1s",
	}})
	ctx := context.Background()
	testCfg := rest.CopyConfig(cp.Config)
	testCfg.QPS, testCfg.Burst = -1, 0 // the test's own polling is never held back
	client := versioned.NewForConfigOrDie(testCfg)
	ns := "relist"
	if err := testenv.EnsureNamespace(ctx, kubernetes.NewForConfigOrDie(testCfg), ns); err != nil {
		t.Fatal(err)
	}
	stus := client.BolingcavalryV1().Students(ns)

	// The controller, in-process, over the cutting transport.
	breaker := &watchBreaker{open: map[*watchBody]bool{}}
	cfg := rest.CopyConfig(cp.Config)
	cfg.WrapTransport = breaker.wrap
	path := filepath.Join(t.TempDir(), "registry.db")
	reg, err := registry.Open(ctx, "sqlite://"+path, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	runCtx, cancel := context.WithCancel(klog.NewContext(ctx, klog.Background().WithName(t.Name())))
	wiring, err := controller.NewWiring(runCtx, cfg, reg, controller.WiringOptions{
		Scope: controller.Scope{Namespaces: []string{ns}}, Config: controller.Config{Owner: owner, SweepMaxDeletions: 10},
	})
	if err != nil {
		t.Fatal(err)
	}
	wiring.Start(runCtx)
	done := make(chan error, 1)
	go func() { done <- wiring.Controller.Run(runCtx, 4) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
		wiring.Shutdown()
	})

	create := func(name string, policy studentv1.DeletionPolicy) {
		t.Helper()
		if _, err := stus.Create(ctx, newStudent(name, "深圳中学", policy), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		create(fmt.Sprintf("before-%02d", i), map[bool]studentv1.DeletionPolicy{true: studentv1.DeletionPolicyOrphan}[i%4 == 0])
	}
	waitAllReadyIn(t, stus, 20, time.Minute)

	// Cut the watch, and note where the controller's cache is: at most this version.
	list, err := stus.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := list.ResourceVersion
	breaker.cut()

	// The gap: creates, spec changes, deletes of both policies.
	for i := range 10 {
		create(fmt.Sprintf("gap-%02d", i), "")
	}
	for i := range 5 {
		s, err := stus.Get(ctx, fmt.Sprintf("before-%02d", i+1), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Spec.School = "北京四中"
		if _, err := stus.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deleted := []string{"before-08", "before-09", "before-10", "before-12"} // before-08 and -12 are Orphan
	for _, name := range deleted {
		if err := stus.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	orphanUIDs := map[string]bool{}
	for _, s := range list.Items {
		if s.Name == "before-08" || s.Name == "before-12" {
			orphanUIDs[string(s.UID)] = true
		}
	}

	// Until etcd has compacted past the controller's version: a watch from there is
	// refused with 410 Gone, as the controller's will be.
	eventually(t, 30*time.Second, "etcd to compact past the controller's resource version", func(ctx context.Context) (bool, error) {
		return watchExpired(ctx, stus, seen)
	})
	breaker.heal()

	items := waitAllReadyIn(t, stus, 26, time.Minute)
	if !breaker.gone.Load() {
		t.Errorf("the controller's watch was never answered 410 Gone")
	}
	if n := breaker.listsSinceHeal.Load(); n == 0 {
		t.Errorf("the controller did not list again after its watch came back expired")
	} else {
		t.Logf("the controller listed %d times after the watch came back expired", n)
	}
	eventually(t, 30*time.Second, "the Students deleted in the gap to be gone", func(ctx context.Context) (bool, error) {
		for _, name := range deleted {
			if _, err := stus.Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, err
			}
		}
		return true, nil
	})
	db := registrytest.OpenSQLite(t, path)
	assertRowsMatch(t, db, items)
	var released int
	if err := db.QueryRow(`SELECT count(*) FROM students WHERE owner IS NULL AND released_at IS NOT NULL`).Scan(&released); err != nil {
		t.Fatal(err)
	}
	if released != len(orphanUIDs) {
		t.Errorf("%d rows released, want %d (the Orphan Students deleted in the gap)", released, len(orphanUIDs))
	}
}

// watchExpired says whether a watch from resourceVersion is refused as too old.
func watchExpired(ctx context.Context, stus interface {
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}, resourceVersion string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	w, err := stus.Watch(ctx, metav1.ListOptions{ResourceVersion: resourceVersion})
	if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	defer w.Stop()
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			if ev.Type == watch.Error {
				err := apierrors.FromObject(ev.Object)
				return apierrors.IsResourceExpired(err) || apierrors.IsGone(err), nil
			}
		case <-ctx.Done():
			return false, nil
		}
	}
}

// watchBreaker cuts a client's watches: cut ends the running ones, as the API server
// ends a watch at its timeout (the stream simply ends), and refuses new ones until heal,
// as a server that is down does. After heal it counts the lists of Students (plain, or
// streamed: a watch with sendInitialEvents) and notes a watch answered 410 Gone.
type watchBreaker struct {
	mu             sync.Mutex
	refusing       bool
	healed         bool
	open           map[*watchBody]bool
	listsSinceHeal atomic.Int32
	gone           atomic.Bool
}

func (b *watchBreaker) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		q := req.URL.Query()
		isWatch := q.Get("watch") == "true" || q.Get("watch") == "1"
		onStudents := strings.HasSuffix(req.URL.Path, "/students")
		b.mu.Lock()
		refusing, healed := b.refusing, b.healed
		b.mu.Unlock()
		if isWatch && refusing {
			// As an API server that is down: the reflector retries its watch from where
			// it was, rather than listing again.
			return nil, fmt.Errorf("the test cut this client's watches: %w", syscall.ECONNREFUSED)
		}
		if healed && onStudents && req.Method == http.MethodGet && (!isWatch || q.Get("sendInitialEvents") == "true") {
			b.listsSinceHeal.Add(1)
		}
		resp, err := rt.RoundTrip(req)
		if err != nil || !isWatch {
			return resp, err
		}
		if healed && resp.StatusCode == http.StatusGone {
			b.gone.Store(true)
		}
		body := &watchBody{ReadCloser: resp.Body, b: b, watchGone: healed}
		b.mu.Lock()
		b.open[body] = true
		b.mu.Unlock()
		resp.Body = body
		return resp, nil
	})
}

func (b *watchBreaker) cut() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refusing = true
	for body := range b.open {
		body.ended.Store(true)
		body.ReadCloser.Close()
	}
}

func (b *watchBreaker) heal() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refusing, b.healed = false, true
}

type watchBody struct {
	io.ReadCloser
	b *watchBreaker
	// ended: the stream ends here, cleanly, whatever the closed connection says.
	ended atomic.Bool
	// watchGone: look for a 410 Gone error event in this stream (JSON).
	watchGone bool
}

func (w *watchBody) Read(p []byte) (int, error) {
	n, err := w.ReadCloser.Read(p)
	if w.ended.Load() {
		return 0, io.EOF
	}
	if w.watchGone && n > 0 && strings.Contains(string(p[:n]), `"code":410`) {
		w.b.gone.Store(true)
	}
	return n, err
}

func (w *watchBody) Close() error {
	w.b.mu.Lock()
	delete(w.b.open, w)
	w.b.mu.Unlock()
	return w.ReadCloser.Close()
}
