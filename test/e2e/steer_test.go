package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// annotate sets the annotation key of a Student to value, or removes it when value is
// nil, as `kubectl annotate` does.
func annotate(t *testing.T, client versioned.Interface, ns, name, key string, value *string) {
	t.Helper()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{key: value}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.BolingcavalryV1().Students(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotate Student %s/%s %s: %v", ns, name, key, err)
	}
}

// pauseStudent pauses a Student (or unpauses it), and waits until the controller shows
// it in status: the Synced=False condition, reason Paused (or its absence).
func pauseStudent(t *testing.T, client versioned.Interface, ns, name string, pause bool) {
	t.Helper()
	value := new("true")
	if !pause {
		value = nil
	}
	annotate(t, client, ns, name, studentv1.AnnotationPaused, value)
	eventually(t, 30*time.Second, fmt.Sprintf("Student %s/%s paused=%v in status", ns, name, pause), func(ctx context.Context) (bool, error) {
		s, err := client.BolingcavalryV1().Students(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionSynced)
		if !pause {
			return c == nil, nil
		}
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == studentv1.ReasonPaused, nil
	})
}

// TestPauseAndReconcileRequest: a paused Student's row, edited by hand, stays as edited
// through a spec change, a reconcile request and its own deletion, until it is
// unpaused; then it is repaired (or, deleted, let go). A reconcile request repairs a
// row that nothing else would (no sweep, no resync) within seconds, and status records
// it as handled.
func TestPauseAndReconcileRequest(t *testing.T) {
	t.Parallel()
	registrytest.ForEach(t, pg, testPauseAndReconcileRequest)
}

func testPauseAndReconcileRequest(t *testing.T, b registrytest.Backend) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	client := versioned.NewForConfigOrDie(env.Config)
	ctx := context.Background()
	createMany(t, ns, 3, "s")
	byName := map[string]studentv1.Student{}
	for _, s := range waitAllReady(t, ns, 3, time.Minute) {
		byName[s.Name] = s
	}
	handEdit := func(name string) {
		t.Helper()
		if _, err := db.Exec(`UPDATE students SET school = 'edited by hand' WHERE uid = $1`, string(byName[name].UID)); err != nil {
			t.Fatal(err)
		}
	}
	school := func(name string) string { return rowsOf(t, db)[string(byName[name].UID)].School }

	// Paused: edited by hand, then everything that would make the controller write.
	pauseStudent(t, client, ns, "s-000", true)
	pauseStudent(t, client, ns, "s-001", true)
	handEdit("s-000")
	handEdit("s-001")
	s0, err := students(ns).Get(ctx, "s-000", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s0.Spec.School = "北京四中"
	if _, err := students(ns).Update(ctx, s0, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	annotate(t, client, ns, "s-000", studentv1.AnnotationReconcileRequestedAt, new("while-paused"))
	if err := students(ns).Delete(ctx, "s-001", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	if got := school("s-000"); got != "edited by hand" {
		t.Errorf("paused s-000's row was written: school %q", got)
	}
	if got := school("s-001"); got != "edited by hand" {
		t.Errorf("paused, deleted s-001's row was changed: school %q", got)
	}
	s1, err := students(ns).Get(ctx, "s-001", metav1.GetOptions{})
	if err != nil || s1.DeletionTimestamp == nil {
		t.Errorf("paused s-001 after its deletion: %v, deletionTimestamp %v; want it Terminating", err, s1.DeletionTimestamp)
	}
	s0, err = students(ns).Get(ctx, "s-000", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if s0.Status.LastHandledReconcileAt != "" || s0.Status.ObservedGeneration == s0.Generation {
		t.Errorf("paused s-000 status: lastHandledReconcileAt %q, observedGeneration %d of %d; want the request unhandled and the spec unobserved",
			s0.Status.LastHandledReconcileAt, s0.Status.ObservedGeneration, s0.Generation)
	}

	// Unpaused: the row is repaired from the spec, the pending request handled; the
	// deleted Student goes, with its row.
	pauseStudent(t, client, ns, "s-000", false)
	annotate(t, client, ns, "s-001", studentv1.AnnotationPaused, nil) // it goes: nothing to wait for in its status
	eventually(t, 30*time.Second, "the unpaused Students' rows repaired and let go", func(ctx context.Context) (bool, error) {
		s, err := students(ns).Get(ctx, "s-000", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, err = students(ns).Get(ctx, "s-001", metav1.GetOptions{})
		_, row1 := rowsOf(t, db)[string(byName["s-001"].UID)]
		return school("s-000") == "北京四中" && isReady(s) && s.Status.LastHandledReconcileAt == "while-paused" &&
			apierrors.IsNotFound(err) && !row1, nil
	})

	// A reconcile request: a row edited by hand stays so (no sweep, no resync), until
	// the request, which repairs it and is recorded.
	handEdit("s-002")
	time.Sleep(time.Second)
	if got := school("s-002"); got != "edited by hand" {
		t.Fatalf("s-002's row was repaired before any request (school %q): the test shows nothing", got)
	}
	asked := time.Now()
	annotate(t, client, ns, "s-002", studentv1.AnnotationReconcileRequestedAt, new("2026-12-01T05:30:00Z"))
	eventually(t, 10*time.Second, "the reconcile request handled", func(ctx context.Context) (bool, error) {
		s, err := students(ns).Get(ctx, "s-002", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return s.Status.LastHandledReconcileAt == "2026-12-01T05:30:00Z", nil
	})
	if got := school("s-002"); got != "深圳中学" {
		t.Errorf("after the reconcile request, s-002's row holds school %q, want it repaired", got)
	}
	t.Logf("reconcile request handled in %v", time.Since(asked).Round(time.Millisecond))
	assertRowsMatch(t, db, waitAllReady(t, ns, 2, 10*time.Second))
}
