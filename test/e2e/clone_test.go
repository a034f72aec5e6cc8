package e2e

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/student-controller/student-controller/internal/registry"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
	studentclient "github.com/student-controller/student-controller/pkg/generated/clientset/versioned/typed/bolingcavalry/v1"
)

// TestClone: a clone of the cluster (a second control plane started from a copy of
// the first's etcd data, as a DR drill or a staging refresh makes one) runs a
// controller with production's registry and owner. The cluster binding cannot tell
// them apart: the clone keeps kube-system's UID. The registry's write fence can: while
// production's controller holds it, the clone's waits, not Ready, naming the holder,
// and writes nothing, whatever its Students do. Once production's controller is gone
// (killed: after the fence's lease runs out), the clone's takes over: it undoes at
// most --registry-max-rewinds rows of production's past (a row production wrote
// since the snapshot rewound, rows of Students production deleted since written
// again), and past the bound its Students say why and nothing is written. A
// controller that stops gracefully hands the fence over at once.
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
	// maxUndos is the clone's --registry-max-rewinds: of the three rows of production's
	// past it finds (r1 ahead, d1 and d2 deleted), it undoes one.
	const maxUndos = 1
	args := func(kubeconfig string, extra ...string) []string {
		return append([]string{"--kubeconfig", kubeconfig, "--registry", "sqlite://" + path, "--registry-owner", owner,
			"--sweep-interval", "2s", "--registry-fence-lease", lease.String()}, extra...)
	}
	prodCtrl := startProcess(t, "production", args(prod.Kubeconfig)...)
	uids := createAll(t, prodStudents, map[string]studentv1.DeletionPolicy{"r1": "Delete", "r2": "Delete", "r3": "Delete",
		"d1": "Delete", "d2": "Delete"})
	waitAllReadyIn(t, prodStudents, 5, time.Minute)

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
	waitAllReadyIn(t, cloneStudents, 5, time.Minute)
	// Production goes on after the snapshot: d1 and d2 deleted, rows and all.
	for _, name := range []string{"d1", "d2"} {
		if err := prodStudents.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitRows(t, db, "d1's and d2's rows deleted by production", func(rows map[string]row) bool {
		_, d1 := rows[uids["d1"]]
		_, d2 := rows[uids["d2"]]
		return !d1 && !d2
	})

	cloneCtrl := startProcess(t, "clone", args(clone.Kubeconfig, "--registry-max-rewinds", strconv.Itoa(maxUndos))...)
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
	checkCloneUndoBound(t, db, cloneStudents, cloneCtrl, uids, maxUndos)

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

// checkCloneUndoBound checks what a clone's controller did with the rows of
// production's past it found once it held the fence: r1 ahead of the clone's Student,
// d1 and d2 deleted by production since the snapshot. It undoes maxUndos of them (r1
// rewound to the clone's Student, d1 or d2 written again); the others' Students are
// Ready=False saying why (RegistryAhead, RowDeleted), their rows untouched, and each
// refusal counted for the StudentRegistryRewritesRefused alert.
func checkCloneUndoBound(t *testing.T, db *sql.DB, students studentclient.StudentInterface, ctrl *process, uids map[string]string, maxUndos int) {
	t.Helper()
	refusedReason := map[string]string{"r1": studentv1.ReasonRegistryAhead, "d1": studentv1.ReasonRowDeleted, "d2": studentv1.ReasonRowDeleted}
	var undone, refused, seen []string
	done := func() bool {
		undone, refused, seen = nil, nil, nil
		rows := sqliteRows(t, db)
		for name, reason := range refusedReason {
			s, err := students.Get(context.Background(), name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ready := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionReady)
			r, ok := rows[uids[name]]
			seen = append(seen, fmt.Sprintf("%s: row %+v (%v), Ready %+v", name, r, ok, ready))
			switch {
			case ready != nil && ready.Status == metav1.ConditionFalse && ready.Reason == reason:
				refused = append(refused, name)
			case ok && r == row{owner, s.Spec.School, s.Generation} && ready != nil && ready.Status == metav1.ConditionTrue:
				undone = append(undone, name)
			}
		}
		return len(undone) == maxUndos && len(refused) == len(refusedReason)-maxUndos
	}
	for deadline := time.Now().Add(time.Minute); !done(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after a minute, want %d of the clone's 3 undos done and the rest refused:\n%s", maxUndos, strings.Join(seen, "\n"))
		}
	}
	rows := sqliteRows(t, db)
	for _, name := range refused {
		r, ok := rows[uids[name]]
		switch {
		case name == "r1" && r != row{owner, "production's school", 2}:
			t.Errorf("r1's row after its rewind was refused: %+v, want production's", r)
		case name != "r1" && ok:
			t.Errorf("%s's row after writing it again was refused: %+v, want none", name, r)
		}
	}
	_, body, err := get("http://" + ctrl.MetricsAddr + "/metrics")
	if got := testenv.MetricSum(body, "student_controller_registry_rewrites_refused_total", nil); err != nil || got < float64(len(refused)) {
		t.Errorf("student_controller_registry_rewrites_refused_total %v (%v), want at least %d: the refusals %v", got, err, len(refused), refused)
	}
	t.Logf("the clone's controller undid %v and refused %v", undone, refused)
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
