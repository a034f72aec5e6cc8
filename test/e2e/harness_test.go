package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	_ "modernc.org/sqlite"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/pgtest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

const owner = "e2e-controller"

var (
	env *controlplane.Env
	// controllerID is the controller's ServiceAccount with exactly the RBAC of
	// config/rbac: every controller in these tests runs as it, never as an admin.
	controllerID *controlplane.Identity
	// pg is the PostgreSQL server behind the postgres registries.
	pg *pgtest.Server
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	keepFuzzPipesFromChildren()
	var err error
	env, err = controlplane.Start(controlplane.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "end-to-end tests cannot run: %v\n", err)
		return 1
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop control plane: %v\n", err)
		}
	}()
	ctx := context.Background()
	if err := env.InstallRBAC(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "end-to-end tests cannot run: %v\n", err)
		return 1
	}
	if controllerID, err = env.ServiceAccount(ctx, systemNamespace, serviceAccount); err != nil {
		fmt.Fprintf(os.Stderr, "end-to-end tests cannot run: %v\n", err)
		return 1
	}
	if pg, err = pgtest.Start(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "end-to-end tests cannot run: %v\n", err)
		return 1
	}
	defer func() {
		if err := pg.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "stop PostgreSQL: %v\n", err)
		}
	}()
	defer func() {
		if err := ctrlbin.RemoveAll(); err != nil {
			fmt.Fprintf(os.Stderr, "remove the controller binary: %v\n", err)
		}
	}()
	return m.Run()
}

// keepFuzzPipesFromChildren marks a fuzz worker's pipes to its coordinator (file
// descriptors 3, 4 and 5, which Go's fuzzing engine hands over) close-on-exec. Without
// it etcd, kube-apiserver and PostgreSQL inherit them; and when the engine kills a
// worker, as it does when one call takes 10 s, the control plane it leaves behind holds
// the pipe open, so the coordinator waits for ever instead of reporting the input.
func keepFuzzPipesFromChildren() {
	if !slices.ContainsFunc(os.Args[1:], func(arg string) bool { return strings.HasPrefix(arg, "-test.fuzzworker") }) {
		return
	}
	for fd := 3; fd <= 5; fd++ {
		syscall.CloseOnExec(fd)
	}
}

// requestCounter counts the API requests that pass through it, by verb and resource.
type requestCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
		if req.Method != http.MethodGet {
			c.mu.Lock()
			c.counts[req.Method+" "+resourceOf(req.URL.Path)]++
			c.mu.Unlock()
		}
		return rt.RoundTrip(req)
	})
}

// writes returns the write requests counted so far, by method and resource.
func (c *requestCounter) writes() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]int{}
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf turns /apis/g/v/namespaces/ns/students/name/status into students/status.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+1 < len(parts); i++ {
		if parts[i] == "namespaces" && i+2 < len(parts) {
			rest := parts[i+2:]
			if len(rest) >= 3 {
				return rest[0] + "/" + rest[2]
			}
			return rest[0]
		}
	}
	return path
}

// countingRegistry counts the calls the controller makes to the real registry.
type countingRegistry struct {
	*registry.Registry
	gets, writes atomic.Int64
}

func (r *countingRegistry) Get(ctx context.Context, uid string) (registry.Record, error) {
	r.gets.Add(1)
	return r.Registry.Get(ctx, uid)
}

// Apply counts the row writes: an insert that found the row there wrote nothing.
func (r *countingRegistry) Apply(ctx context.Context, op registry.Op) (registry.Result, error) {
	out, err := r.Registry.Apply(ctx, op)
	switch op.Kind {
	case registry.OpInsert, registry.OpUpsert, registry.OpDelete, registry.OpRelease:
		if !errors.Is(err, registry.ErrExists) {
			r.writes.Add(1)
		}
	}
	return out, err
}

// running is a controller running in this process, wired by controller.NewWiring as
// the binary wires it, limited to one namespace so that tests do not see each other's
// Students.
type running struct {
	requests *requestCounter
	registry *countingRegistry
	metrics  *prometheus.Registry
	stop     func()
}

type controllerOptions struct {
	registryURL   string
	namespace     string // --namespace: one, or several separated by commas
	selector      string // --selector
	sweepInterval time.Duration
	resync        time.Duration
}

func startController(t *testing.T, opts controllerOptions) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().WithName(t.Name())))

	counter := &requestCounter{counts: map[string]int{}}
	cfg := rest.CopyConfig(controllerID.Config)
	cfg.WrapTransport = counter.wrap

	reg, err := registry.Open(ctx, opts.registryURL, registry.Options{})
	if err != nil {
		t.Fatal(err)
	}
	counting := &countingRegistry{Registry: reg}
	metrics := prometheus.NewRegistry()
	scope, err := controller.ParseScope(opts.namespace, opts.selector)
	if err != nil {
		t.Fatal(err)
	}
	wiring, err := controller.NewWiring(ctx, cfg, counting, controller.WiringOptions{
		Scope:        scope,
		ResyncPeriod: opts.resync,
		Config: controller.Config{
			Owner: owner, SweepInterval: opts.sweepInterval, SweepMaxDeletions: 10,
			Metrics: controller.NewMetrics(metrics),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	wiring.Start(ctx)
	done := make(chan error, 1)
	go func() { done <- wiring.Controller.Run(ctx, 4) }()

	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("controller: %v", err)
			}
			wiring.Shutdown()
			reg.Close()
		})
	}
	t.Cleanup(stop)
	return &running{requests: counter, registry: counting, metrics: metrics, stop: stop}
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, timeout, true, cond)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func isReady(s *studentv1.Student) bool {
	c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
	return c != nil && c.Status == metav1.ConditionTrue && c.ObservedGeneration == s.Generation
}

func kubeClient() kubernetes.Interface { return kubernetes.NewForConfigOrDie(env.Config) }

// waitOutageShown waits until a Student reports Ready=False for the registry's outage.
func waitOutageShown(t *testing.T, ns, name string) {
	t.Helper()
	eventually(t, time.Minute, name+" to report the registry outage", func(ctx context.Context) (bool, error) {
		s, err := students(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == studentv1.ReasonRegistryUnavailable, nil
	})
}
