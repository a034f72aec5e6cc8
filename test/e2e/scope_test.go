package e2e

import (
	"context"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/ctrlbin"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestScope: a controller that watches two namespaces and the Students labeled
// team=blue syncs those alone. A Student outside the scope (another namespace, another
// label, no label) is never written to, not even a finalizer (its resourceVersion
// stays as created), and gets no row; the sweep leaves the row of a Student that left
// the scope (relabeled), and plan with the same flags finds nothing to do. Back in
// scope, the Student is synced and its deletion lets its row go.
func TestScope(t *testing.T) {
	t.Parallel()
	registrytest.ForEach(t, pg, testScope)
}

func testScope(t *testing.T, b registrytest.Backend) {
	ctx := context.Background()
	a, bb, c := testenv.Namespace(t, kubeClient(), "e2e-"), testenv.Namespace(t, kubeClient(), "e2e-"), testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	create := func(ns, name, team string) *studentv1.Student {
		t.Helper()
		s := newStudent(name, "深圳中学", studentv1.DeletionPolicyDelete)
		if team != "" {
			s.Labels = map[string]string{"team": team}
		}
		created, err := students(ns).Create(ctx, s, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	// Outside: no label, another label, another namespace.
	outside := []*studentv1.Student{create(a, "unlabeled", ""), create(a, "red", "red"), create(c, "blue-elsewhere", "blue")}
	scope := a + "," + bb
	ctl := startController(t, controllerOptions{registryURL: url, namespace: scope, selector: "team=blue", sweepInterval: time.Second})
	inside := []*studentv1.Student{create(a, "blue-a", "blue"), create(bb, "blue-b", "blue")}
	for _, s := range inside {
		waitReady(t, s.Namespace, s.Name)
	}
	waitSweeps(t, ctl, 2)

	rowsNow := func() []string {
		var uids []string
		for uid := range rowsOf(t, db) {
			uids = append(uids, uid)
		}
		slices.Sort(uids)
		return uids
	}
	want := []string{string(inside[0].UID), string(inside[1].UID)}
	slices.Sort(want)
	if got := rowsNow(); !slices.Equal(got, want) {
		t.Errorf("rows %v, want those of the Students in scope alone: %v", got, want)
	}
	for _, s := range outside {
		now, err := students(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if now.ResourceVersion != s.ResourceVersion || len(now.Status.Conditions) != 0 {
			t.Errorf("Student %s/%s outside the scope was written to: resourceVersion %s (created %s), conditions %v",
				s.Namespace, s.Name, now.ResourceVersion, s.ResourceVersion, now.Status.Conditions)
		}
	}

	// blue-b leaves the scope: the API server tells the informer it is gone, and the
	// sweep asks it again before it lets the row go. The row stays, and plan with the
	// controller's flags agrees.
	relabel := func(team string) {
		t.Helper()
		s, err := students(bb).Get(ctx, "blue-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Labels["team"] = team
		if _, err := students(bb).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	relabel("red")
	waitSweeps(t, ctl, 3)
	if got := rowsNow(); !slices.Equal(got, want) {
		t.Errorf("rows after blue-b left the scope: %v, want %v (its row kept)", got, want)
	}
	planURL, password := registrytest.ForProcess(t, url)
	plan := exec.Command(ctrlbin.Binary(t), append([]string{"plan", "--kubeconfig", controllerID.Kubeconfig, "--registry", planURL, // #nosec G204 -- the controller built for the test
		"--registry-owner", owner, "--namespace", scope, "--selector", "team=blue"}, password...)...)
	out, err := plan.Output()
	if code := exitCode(err); code != 0 || !strings.Contains(string(out), "Nothing would change.") ||
		!strings.Contains(string(out), "labels team=blue") {
		t.Errorf("plan with the controller's scope exited %d (%v), want 0 and nothing to change, the scope named:\n%s", code, err, out)
	}

	// Back in scope, and deleted: the controller finalizes it, its row goes.
	relabel("blue")
	if err := students(bb).Delete(ctx, "blue-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, time.Minute, "blue-b's row deleted with it", func(context.Context) (bool, error) {
		_, ok := rowsOf(t, db)[string(inside[1].UID)]
		return !ok, nil
	})

	// The Students outside the scope keep the finalizer the cluster-wide admission
	// policy gave them; take it off so that their namespaces can go.
	for _, s := range outside {
		if _, err := students(s.Namespace).Patch(ctx, s.Name, "application/merge-patch+json",
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitReady waits until the Student is Ready at its generation.
func waitReady(t *testing.T, ns, name string) {
	t.Helper()
	eventually(t, time.Minute, "Student "+ns+"/"+name+" Ready", func(ctx context.Context) (bool, error) {
		s, err := students(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && isReady(s), nil
	})
}

// waitSweeps waits until the controller has finished n more sweeps.
func waitSweeps(t *testing.T, ctl *running, n int) {
	t.Helper()
	count := func() float64 {
		families, err := ctl.metrics.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var sum float64
		for _, f := range families {
			if f.GetName() == "student_controller_sweep_total" {
				for _, m := range f.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
		return sum
	}
	from := count()
	eventually(t, 30*time.Second, "sweeps", func(context.Context) (bool, error) { return count() >= from+float64(n), nil })
}
