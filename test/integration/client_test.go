package integration

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/klog/v2/ktesting"

	"github.com/student-controller/student-controller/internal/testenv"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	applyv1 "github.com/student-controller/student-controller/pkg/generated/applyconfiguration/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/informers/externalversions"
)

// TestGeneratedClient exercises the generated clientset, apply configurations, informer
// and lister against the real API server: create, apply, get, list, watch and
// update status, and the informer's cache following along.
func TestGeneratedClient(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	ns := testenv.Namespace(t, c.kube, "test-")
	students := c.student.BolingcavalryV1().Students(ns)

	list, err := students.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	if len(list.Items) != 0 {
		t.Fatalf("a new namespace lists %d Students", len(list.Items))
	}
	w, err := students.Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()

	factory := externalversions.NewSharedInformerFactoryWithOptions(c.student, 0, externalversions.WithNamespace(ns))
	informer := factory.Bolingcavalry().V1().Students()
	lister := informer.Lister()
	informer.Informer() // register before Start
	informerCtx, stopInformers := context.WithCancel(ctx)
	factory.Start(informerCtx.Done())
	defer func() {
		stopInformers()
		factory.Shutdown() // waits for the informer to stop
	}()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer cache for %v did not sync", typ)
		}
	}

	// Create with the typed client, and another through server-side apply.
	created, err := students.Create(ctx, &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Name: "zhang-san"},
		Spec:       studentv1.StudentSpec{Name: "张三", School: "深圳中学"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	applied, err := students.Apply(ctx, applyv1.Student("li-si", ns).
		WithSpec(applyv1.StudentSpec().WithName("李四").WithSchool("深圳中学").WithDeletionPolicy(studentv1.DeletionPolicyOrphan)),
		metav1.ApplyOptions{FieldManager: "integration-test", Force: true})
	if err != nil {
		t.Fatalf("apply: %v", err)
	}
	if applied.Spec.DeletionPolicy != studentv1.DeletionPolicyOrphan {
		t.Errorf("applied deletionPolicy = %q, want Orphan", applied.Spec.DeletionPolicy)
	}

	got, err := students.Get(ctx, "zhang-san", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.UID != created.UID || got.Spec.Name != "张三" {
		t.Errorf("get returned %s/%s uid %s, want the created object", got.Namespace, got.Name, got.UID)
	}
	list, err = students.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	var names []string
	for _, s := range list.Items {
		names = append(names, s.Name)
	}
	if diff := cmp.Diff([]string{"li-si", "zhang-san"}, names); diff != "" {
		t.Errorf("listed names (-want +got):\n%s", diff)
	}

	// Update status through the subresource.
	withStatus := got.DeepCopy()
	withStatus.Status.ObservedGeneration = got.Generation
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	withStatus.Status.Registry = &studentv1.RegistryStatus{Owner: "test", LastWrittenTime: &now, WrittenGeneration: got.Generation}
	meta.SetStatusCondition(&withStatus.Status.Conditions, metav1.Condition{
		Type: studentv1.ConditionReady, Status: metav1.ConditionTrue, Reason: studentv1.ReasonSynced, Message: "row written",
	})
	if _, err := students.UpdateStatus(ctx, withStatus, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status: %v", err)
	}

	// The watch saw both creations and the status update, in order.
	type event struct {
		Type  watch.EventType
		Name  string
		Ready bool
	}
	var events []event
	timeout := time.After(30 * time.Second)
	for len(events) < 3 {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %v", events)
			}
			s := e.Object.(*studentv1.Student)
			events = append(events, event{e.Type, s.Name, meta.IsStatusConditionTrue(s.Status.Conditions, studentv1.ConditionReady)})
		case <-timeout:
			t.Fatalf("watch delivered only %v", events)
		}
	}
	wantEvents := []event{{watch.Added, "zhang-san", false}, {watch.Added, "li-si", false}, {watch.Modified, "zhang-san", true}}
	if diff := cmp.Diff(wantEvents, events); diff != "" {
		t.Errorf("watch events (-want +got):\n%s", diff)
	}

	// The lister serves both objects and, soon, the new status from the informer's cache.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cached, err := lister.Students(ns).Get("zhang-san")
		if err != nil {
			return false, err
		}
		return meta.IsStatusConditionTrue(cached.Status.Conditions, studentv1.ConditionReady), nil
	})
	if err != nil {
		t.Fatalf("the lister never served the status update: %v", err)
	}
	all, err := lister.Students(ns).List(labels.Everything())
	if err != nil {
		t.Fatalf("lister list: %v", err)
	}
	if len(all) != 2 {
		t.Errorf("lister lists %d Students, want 2", len(all))
	}
	cached, err := lister.Students(ns).Get("zhang-san")
	if err != nil {
		t.Fatalf("lister get: %v", err)
	}
	if cached.Status.Registry == nil || cached.Status.Registry.Owner != "test" || !cached.Status.Registry.LastWrittenTime.Equal(&now) {
		t.Errorf("cached registry status = %+v, want owner test written at %v", cached.Status.Registry, now)
	}
}
