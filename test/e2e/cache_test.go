package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/student-controller/student-controller/internal/controller"
	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// TestWritesKeepWhatTheCacheLeavesOut: the controller's cache keeps only what it reads
// of a Student, and builds its writes from that; what it leaves out (labels, other
// annotations, owner references, other finalizers) survives every write it makes: the
// status writes of a sync and of a pause, putting its finalizer back, and taking it off
// on delete.
func TestWritesKeepWhatTheCacheLeavesOut(t *testing.T) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := registrytest.SQLiteBackend().New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	client := versioned.NewForConfigOrDie(env.Config)
	students := client.BolingcavalryV1().Students(ns)
	ctx := context.Background()

	owner, err := kubeClient().CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owner"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const other = "example.com/other"
	s := newStudent("kept", "深圳中学", "")
	s.Labels = map[string]string{"team": "a"}
	s.Annotations = map[string]string{"example.com/note": "hello"}
	s.Finalizers = []string{other}
	s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: owner.Name, UID: owner.UID}}
	if _, err := students.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What the controller leaves out, as it should stay.
	check := func(when string, finalizers ...string) *studentv1.Student {
		t.Helper()
		got, err := students.Get(ctx, s.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(s.Labels, got.Labels); diff != "" {
			t.Errorf("%s: labels (-want +got):\n%s", when, diff)
		}
		if got.Annotations["example.com/note"] != "hello" {
			t.Errorf("%s: annotations %v; want example.com/note kept", when, got.Annotations)
		}
		if len(got.OwnerReferences) != 1 || got.OwnerReferences[0].UID != owner.UID {
			t.Errorf("%s: owner references %v; want the ConfigMap's kept", when, got.OwnerReferences)
		}
		if diff := cmp.Diff(finalizers, got.Finalizers); diff != "" {
			t.Errorf("%s: finalizers (-want +got):\n%s", when, diff)
		}
		return got
	}

	waitAllReady(t, ns, 1, time.Minute)
	check("Ready", other, controller.Finalizer)

	pauseStudent(t, client, ns, s.Name, true)
	check("paused", other, controller.Finalizer)
	pauseStudent(t, client, ns, s.Name, false)
	check("unpaused", other, controller.Finalizer)

	// Its finalizer taken off by hand: the controller puts it back, and only it.
	patch := fmt.Sprintf(`{"metadata":{"finalizers":[%q]}}`, other)
	if _, err := students.Patch(ctx, s.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the controller's finalizer back", func(ctx context.Context) (bool, error) {
		got, err := students.Get(ctx, s.Name, metav1.GetOptions{})
		return err == nil && slices.Contains(got.Finalizers, controller.Finalizer), err
	})
	check("finalizer put back", other, controller.Finalizer)

	// Deleted: the row goes, and the controller takes off its own finalizer alone.
	if err := students.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the controller's finalizer off", func(ctx context.Context) (bool, error) {
		got, err := students.Get(ctx, s.Name, metav1.GetOptions{})
		return err == nil && !slices.Contains(got.Finalizers, controller.Finalizer), err
	})
	if got := check("deleted, held by the other finalizer", other); got.DeletionTimestamp == nil {
		t.Error("not Terminating after its delete")
	}
	var rows int
	if err := db.QueryRow(`SELECT count(*) FROM students`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d registry rows after the delete; want none", rows)
	}
	if _, err := students.Patch(ctx, s.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the Student gone", func(ctx context.Context) (bool, error) {
		_, err := students.Get(ctx, s.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}
