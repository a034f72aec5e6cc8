package controller

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2/ktesting"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// FuzzHandlers: whatever the informer hands the event handlers (Students with any
// namespace, name and versions, tombstones with any key and anything or nothing
// inside, objects of another kind, nil), they never panic and queue only what the
// worker can take: a Student's own namespace/name, or a tombstone's key; and the
// worker syncs every queued key without panicking and without retrying it forever
// (nothing in the cache: nothing to do; a malformed key: terminal).
func FuzzHandlers(f *testing.F) {
	f.Add("school", "a", "school/a", uint8(0), uint8(0), "1", "2", int64(1), int64(2))
	f.Add("school", "a", "school/a", uint8(1), uint8(1), "1", "1", int64(1), int64(1))
	f.Add("", "a", "a", uint8(2), uint8(3), "", "", int64(0), int64(0))
	f.Add("a/b", "c/d", "a/b/c", uint8(3), uint8(4), "x", "y", int64(-1), int64(9))
	f.Add("", "", "", uint8(5), uint8(6), "", "1", int64(0), int64(1))
	f.Add("school", "a", "/", uint8(6), uint8(7), "2", "1", int64(2), int64(1))
	f.Add("school", "a", "school/a/b", uint8(7), uint8(0), "1", "2", int64(1), int64(1))
	// One controller for every input (a fixture costs a SQLite file): each input starts
	// and ends with an empty queue.
	fx := newFixture(f)
	c := fx.ctrl
	f.Fuzz(func(t *testing.T, ns, name, key string, shape1, shape2 uint8, rv1, rv2 string, gen1, gen2 int64) {
		logger, ctx := ktesting.NewTestContext(t)
		student := func(rv string, gen int64) *cachedStudent {
			return compactStudent(&studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, ResourceVersion: rv, Generation: gen}})
		}
		object := func(shape uint8, rv string, gen int64) any {
			switch shape % 8 {
			case 0:
				return student(rv, gen)
			case 1:
				return cache.DeletedFinalStateUnknown{Key: key, Obj: student(rv, gen)}
			case 2:
				return cache.DeletedFinalStateUnknown{Key: key, Obj: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}}
			case 3:
				return cache.DeletedFinalStateUnknown{Key: key}
			case 4:
				return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
			case 5:
				return nil
			case 6:
				return (*cachedStudent)(nil)
			default:
				return key
			}
		}
		oldObj, newObj := object(shape1, rv1, gen1), object(shape2, rv2, gen2)

		c.enqueue(logger, newObj)               // AddFunc and DeleteFunc
		c.enqueueUpdate(logger, oldObj, newObj) // UpdateFunc
		c.enqueue(logger, oldObj)

		allowed := map[string]bool{}
		for _, obj := range []any{oldObj, newObj} {
			switch o := obj.(type) {
			case *cachedStudent:
				if o != nil {
					allowed[o.key] = true
				}
			case cache.DeletedFinalStateUnknown:
				allowed[o.Key] = true
			}
		}
		for c.queue.Len() > 0 {
			k, _ := c.queue.Get()
			c.queue.Done(k)
			if !allowed[k] {
				t.Errorf("queued %q, not the key of anything handed over (%#v, %#v)", k, oldObj, newObj)
			}
			c.queue.Add(k) // for the worker
			if !c.processNextWorkItem(ctx) {
				t.Fatal("the queue shut down")
			}
			if n := c.queue.NumRequeues(k); n != 0 {
				t.Errorf("key %q is retried (%d): the worker should drop what it can never sync", k, n)
			}
		}
	})
}
