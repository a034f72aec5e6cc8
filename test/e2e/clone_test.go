package e2e

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// TestClone: a clone of the cluster (a second control plane started from a copy of
// the first's etcd data, as a DR drill or a staging refresh makes one) runs a
// controller with production's registry and owner. The cluster binding cannot tell
// them apart: the clone keeps kube-system's UID. The registry's write fence can: while
// production's controller holds it, the clone's waits, not Ready, naming the holder,
// and writes nothing, whatever its Students do. Once production's controller is gone
// (killed: after the fence's lease runs out), the clone's takes over; a controller
// that stops gracefully hands the fence over at once.
func TestClone(t *testing.T) {
	t.Parallel() // a control plane of its own
	ctx := context.Background()
	prod := controlplane.ForTest(t, controlplane.Options{WithoutControllerManager: true})
	const ns = "clone"
	if err := testenv.EnsureNamespace(ctx, kubernetes.NewForConfigOrDie(prod.Config), ns); err != nil {
		t.Fatal(err)
	}
	prodStudents := versioned.NewForConfigOrDie(prod.Config).BolingcavalryV1().Students(ns)
	path := filepath.Join(t.TempDir(), "registry.db")
	db := registrytest.OpenSQLite(t, path)
	const lease = 4 * time.Second
	args := func(kubeconfig string) []string {
		return []string{"--kubeconfig", kubeconfig, "--registry", "sqlite://" + path, "--registry-owner", owner,
			"--sweep-interval", "2s", "--registry-fence-lease", lease.String()}
	}
	prodCtrl := startProcess(t, "production", args(prod.Kubeconfig)...)
	uids := createAll(t, prodStudents, map[string]studentv1.DeletionPolicy{"r1": "Delete", "r2": "Delete", "r3": "Delete"})
	waitAllReadyIn(t, prodStudents, 3, time.Minute)

	// The clone: production's etcd data, copied while its etcd is stopped, under a
	// control plane of its own.
	cloneDir := t.TempDir()
	stopControlPlane(t, prod)
	copyDir(t, filepath.Join(prod.Dir, "etcd"), filepath.Join(cloneDir, "etcd"))
	startControlPlane(t, prod)
	clone := controlplane.ForTest(t, controlplane.Options{Dir: cloneDir, WithoutControllerManager: true})
	if a, b := uidOfCluster(t, prod), uidOfCluster(t, clone); a != b {
		t.Fatalf("the clone's kube-system UID %s, production's %s: want one, as a restored snapshot keeps it", b, a)
	}
	cloneStudents := versioned.NewForConfigOrDie(clone.Config).BolingcavalryV1().Students(ns)
	waitAllReadyIn(t, cloneStudents, 3, time.Minute)

	cloneCtrl := startProcess(t, "clone", args(clone.Kubeconfig)...)
	waitFor(t, 30*time.Second, "the clone's controller to wait, not ready, naming the holder", func() bool {
		code, body, _ := get("http://" + cloneCtrl.ProbeAddr + "/readyz")
		return code == 503 && strings.Contains(body, "holds the registry's write fence")
	})
	if _, body, err := get("http://" + cloneCtrl.MetricsAddr + "/metrics"); err != nil ||
		testenv.MetricSum(body, "student_controller_registry_fence_waiting", nil) != 1 ||
		testenv.MetricSum(body, "student_controller_registry_fence_held", nil) != 0 {
		t.Errorf("the clone's fence metrics: %v\n%s", err, strings.Join(append(metricLines(body, "student_controller_registry_fence_waiting"),
			metricLines(body, "student_controller_registry_fence_held")...), "\n"))
	}
	// The clone's teardown and edits reach no row; production goes on writing.
	setSchool(t, cloneStudents, "r2", "the clone's school")
	if err := cloneStudents.Delete(ctx, "r3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	setSchool(t, prodStudents, "r1", "production's school")
	waitRows(t, db, "r1's row at production's school", func(rows map[string]row) bool {
		return rows[uids["r1"]] == row{owner, "production's school", 2}
	})
	time.Sleep(2 * lease) // several of the clone's sweeps and retries
	want := map[string]row{
		uids["r1"]: {owner, "production's school", 2},
		uids["r2"]: {owner, "school A", 1},
		uids["r3"]: {owner, "school A", 1},
	}
	if got := sqliteRows(t, db); !equalRows(got, want) {
		t.Fatalf("rows while the clone waits: %+v, want production's %+v", got, want)
	}
	if !strings.Contains(cloneCtrl.Output(), "another controller of this owner writes") {
		t.Errorf("the clone's log does not say why it waits:\n%s", cloneCtrl.Output())
	}

	// Production's controller crashes: the clone's takes over once the lease runs
	// out, and its Students are the desired state from then on.
	prodCtrl.signal(syscall.SIGKILL)
	killed := time.Now()
	waitRows(t, db, "the clone's writes: r2 at its school, r3 deleted", func(rows map[string]row) bool {
		_, r3 := rows[uids["r3"]]
		return rows[uids["r2"]] == row{owner, "the clone's school", 2} && !r3
	})
	t.Logf("the clone's controller wrote %v after production's was killed (fence lease %v)", time.Since(killed).Round(time.Millisecond), lease)
	if took := time.Since(killed); took > lease+15*time.Second {
		t.Errorf("the clone took over %v after the kill, want within the lease (%v) and a sync", took, lease)
	}

	// A controller that stops gracefully hands the fence over at once.
	prodAgain := startProcess(t, "production-again", args(prod.Kubeconfig)...)
	waitFor(t, 30*time.Second, "production's new controller to wait for the clone's", func() bool {
		code, _, _ := get("http://" + prodAgain.ProbeAddr + "/readyz")
		return code == 503 && strings.Contains(prodAgain.Output(), "Waiting: writing nothing")
	})
	cloneCtrl.signal(syscall.SIGTERM)
	stopped := time.Now()
	if err := cloneCtrl.wait(30 * time.Second); err != nil {
		t.Errorf("the clone's controller after SIGTERM: %v, want exit 0", err)
	}
	waitFor(t, 30*time.Second, "production's new controller to hold the fence", func() bool {
		code, _, _ := get("http://" + prodAgain.ProbeAddr + "/readyz")
		return code == 200
	})
	if took := time.Since(stopped); took >= lease {
		t.Errorf("the fence was handed over %v after the SIGTERM, want at once, before the lease (%v) could run out", took, lease)
	}
	if !strings.Contains(cloneCtrl.Output(), "Gave back the registry owner's write fence") {
		t.Errorf("the clone's controller did not say it gave the fence back:\n%s", cloneCtrl.Output())
	}
}

// uidOfCluster is the UID of a control plane's kube-system namespace.
func uidOfCluster(t *testing.T, cp *controlplane.Env) string {
	t.Helper()
	ns, err := kubernetes.NewForConfigOrDie(cp.Config).CoreV1().Namespaces().Get(context.Background(), metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return string(ns.UID)
}

// equalRows reports whether two sets of rows are the same.
func equalRows(a, b map[string]row) bool {
	if len(a) != len(b) {
		return false
	}
	for uid, r := range a {
		if b[uid] != r {
			return false
		}
	}
	return true
}

// TestWaitingChangesNothing: a controller that finds its owner's fence held by another
// live controller changes nothing in the registry while it waits, not even the owner's
// cluster binding (or, for a newer version, the schema): it waits first.
func TestWaitingChangesNothing(t *testing.T) {
	ctx := context.Background()
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	path := filepath.Join(t.TempDir(), "registry.db")
	const waiter = "waiting-owner"
	holder, err := registry.Open(ctx, "sqlite://"+path, registry.Options{Actor: "the-other-controller", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.TakeFence(ctx, waiter); err != nil {
		t.Fatal(err)
	}
	p := startProcess(t, "controller", "--kubeconfig", controllerID.Kubeconfig, "--namespace", ns,
		"--registry", "sqlite://"+path, "--registry-owner", waiter)
	waitFor(t, 30*time.Second, "the controller to wait for the other's fence", func() bool {
		code, body, _ := get("http://" + p.ProbeAddr + "/readyz")
		return code == 503 && strings.Contains(body, holder.Holder())
	})
	if _, err := holder.BindingOf(ctx, waiter); !errors.Is(err, registry.ErrNotFound) {
		t.Errorf("the waiting controller's owner binding: %v, want none: it bound the owner before it waited", err)
	}
	// Given back, the fence is the waiting controller's within its poll.
	if err := holder.ReleaseFence(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the controller to take the fence given back, bind its owner and be ready", func() bool {
		code, _, _ := get("http://" + p.ProbeAddr + "/readyz")
		b, err := holder.BindingOf(ctx, waiter)
		return code == 200 && err == nil && b.Cluster != ""
	})
}
