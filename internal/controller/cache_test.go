package controller

import (
	"context"
	"encoding/json"
	"maps"
	"runtime/debug"
	"slices"
	"testing"
	"unsafe"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned/fake"
)

// decoded returns a Student as the informer gets it: decoded from JSON, so that no
// string shares memory with another object's.
func decoded(t *testing.T, name string) *studentv1.Student {
	t.Helper()
	s := newStudent(name)
	s.Finalizers = []string{Finalizer}
	s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
	s.Status.Conditions = []metav1.Condition{ready()}
	s.Status.Registry = &studentv1.RegistryStatus{Owner: "student-controller", WrittenGeneration: 1}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	out := &studentv1.Student{}
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTrimForCache(t *testing.T) {
	// unique.Make shares a string only while a handle to it lives; the handles are
	// dropped at once, so a collection between the two trims would make a second
	// copy (seen in make test). What is checked here is the sharing within a cycle.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	a, b := decoded(t, "a"), decoded(t, "b")
	want := a.DeepCopy()
	want.ManagedFields = nil

	got, err := TrimForCache(a)
	if err != nil {
		t.Fatal(err)
	}
	if !equality.Semantic.DeepEqual(got, want) {
		t.Errorf("TrimForCache changed more than managedFields:\ngot  %+v\nwant %+v", got, want)
	}
	if _, err := TrimForCache(b); err != nil {
		t.Fatal(err)
	}

	same := func(what, x, y string) {
		if unsafe.StringData(x) != unsafe.StringData(y) {
			t.Errorf("%s: two copies of %q; want one shared", what, x)
		}
	}
	same("namespace", a.Namespace, b.Namespace)
	same("finalizer", a.Finalizers[0], b.Finalizers[0])
	same("school", a.Spec.School, b.Spec.School)
	same("condition reason", a.Status.Conditions[0].Reason, b.Status.Conditions[0].Reason)
	same("condition message", a.Status.Conditions[0].Message, b.Status.Conditions[0].Message)
	same("registry owner", a.Status.Registry.Owner, b.Status.Registry.Owner)

	other := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "x", ManagedFields: []metav1.ManagedFieldsEntry{{}}}}
	if out, err := TrimForCache(other); err != nil || out != other || len(other.ManagedFields) != 1 {
		t.Errorf("TrimForCache(%T) = %v, %v; want it passed through untouched", other, out, err)
	}
}

// TestInformerFactory: the Student informer trims what it caches and keeps no index.
func TestInformerFactory(t *testing.T) {
	s := decoded(t, "a")
	client := fake.NewSimpleClientset(s)
	factory := NewInformerFactory(client, s.Namespace, 0)
	informer := factory.Bolingcavalry().V1().Students()
	if indexers := informer.Informer().GetIndexer().GetIndexers(); len(indexers) != 0 {
		t.Errorf("informer indexes %v; want no index", slices.Collect(maps.Keys(indexers)))
	}
	ctx, stop := context.WithCancel(t.Context())
	defer factory.Shutdown()
	defer stop()
	factory.Start(ctx.Done())
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("%v cache did not sync", typ)
		}
	}
	cached, err := informer.Lister().Students(s.Namespace).Get(s.Name)
	if err != nil {
		t.Fatal(err)
	}
	if cached.ManagedFields != nil || cached.Spec != s.Spec {
		t.Errorf("cached %+v; want the Student without managedFields", cached)
	}
}
