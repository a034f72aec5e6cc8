package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/registrytest"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// TestNamespaceDeletion: deleting a namespace that holds Students (Delete and Orphan
// mixed) finishes, as in a cluster: kube-controller-manager's namespace controller
// deletes the Students, the controller lets each go with its row deleted or released,
// and nothing is left Terminating.
func TestNamespaceDeletion(t *testing.T) {
	t.Parallel()
	registrytest.ForEach(t, pg, testNamespaceDeletion)
}

func testNamespaceDeletion(t *testing.T, b registrytest.Backend) {
	const n = 50
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, db := b.New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	ctx := context.Background()

	for i := range n {
		policy := studentv1.DeletionPolicyDelete
		if i%2 == 1 {
			policy = studentv1.DeletionPolicyOrphan
		}
		if _, err := students(ns).Create(ctx, newStudent(fmt.Sprintf("s-%02d", i), "深圳中学", policy), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	items := waitAllReady(t, ns, n, 2*time.Minute)
	assertRowsMatch(t, db, items)

	if err := kubeClient().CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 3*time.Minute, "namespace "+ns+" gone", func(ctx context.Context) (bool, error) {
		_, err := kubeClient().CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})

	rows := rowsOf(t, db)
	for _, s := range items {
		row, ok := rows[string(s.UID)]
		switch s.Spec.DeletionPolicy {
		case studentv1.DeletionPolicyOrphan:
			if !ok || row.Owner != "" || row.StudentName != s.Spec.Name {
				t.Errorf("%s (Orphan): want its row kept and released, got %+v (present %v)", s.Name, row, ok)
			}
		default:
			if ok {
				t.Errorf("%s (Delete): its row is still there: %+v", s.Name, row)
			}
		}
	}
}

// TestGarbageCollection: an object that a Student owns through an ownerReference is
// collected once the Student is gone, by kube-controller-manager's garbage collector.
func TestGarbageCollection(t *testing.T) {
	ns := testenv.Namespace(t, kubeClient(), "e2e-")
	url, _ := registrytest.SQLiteBackend().New(t)
	startController(t, controllerOptions{registryURL: url, namespace: ns})
	ctx := context.Background()

	s, err := students(ns).Create(ctx, newStudent("owner", "深圳中学", studentv1.DeletionPolicyDelete), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitAllReady(t, ns, 1, time.Minute)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "owned", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: studentv1.SchemeGroupVersion.String(), Kind: "Student", Name: s.Name, UID: s.UID,
		}}},
		Data: map[string]string{"student": s.Name},
	}
	if _, err := kubeClient().CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := students(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the owned ConfigMap collected", func(ctx context.Context) (bool, error) {
		_, err := kubeClient().CoreV1().ConfigMaps(ns).Get(ctx, cm.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
}
