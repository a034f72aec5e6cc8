package informer

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned/fake"
)

// outage makes a fake clientset's Student lists and watches fail as they do while the
// API server is down (connection refused), and breaks the watches open when it starts.
type outage struct {
	client  *fake.Clientset
	down    atomic.Bool
	mu      sync.Mutex
	watches []watch.Interface
	tries   []time.Time // lists and watches asked for while down, under mu
	// watchedAt is when the last watch opened, expiredAt when one was refused with
	// 410 Gone (under mu).
	watchedAt, expiredAt time.Time
	// expired: the first watch after the outage is refused as a restarted API server
	// refuses one from before it (410 Gone), so the informer lists again.
	expired atomic.Bool
}

func newOutage(objects ...runtime.Object) *outage {
	o := &outage{client: fake.NewSimpleClientset(objects...)} // as TestInformers: NewClientset's tracker cannot take a Student without a schema
	refused := fmt.Errorf("dial tcp 127.0.0.1:6443: connect: %w", syscall.ECONNREFUSED)
	o.client.PrependReactor("list", "students", func(k8stesting.Action) (bool, runtime.Object, error) {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.down.Load() {
			o.tries = append(o.tries, time.Now())
			return true, nil, refused
		}
		return false, nil, nil
	})
	gvr := schema.GroupVersionResource{Group: "bolingcavalry.k8s.io", Version: "v1", Resource: "students"}
	o.client.PrependWatchReactor("students", func(a k8stesting.Action) (bool, watch.Interface, error) {
		// Under mu, as start: no watch opens as the outage starts and escapes it.
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.down.Load() {
			o.tries = append(o.tries, time.Now())
			return true, nil, refused
		}
		if o.expired.Swap(false) {
			o.expiredAt = time.Now()
			return true, nil, apierrors.NewResourceExpired("too old resource version")
		}
		w, err := o.client.Tracker().Watch(gvr, a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		o.watches = append(o.watches, w)
		o.watchedAt = time.Now()
		return true, w, nil
	})
	return o
}

// start takes the API server down: every open watch ends.
func (o *outage) start() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.down.Store(true)
	o.expired.Store(true)
	for _, w := range o.watches {
		w.Stop()
	}
	o.watches = nil
}

func student(ns, name string) *studentv1.Student {
	return &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
		Spec: studentv1.StudentSpec{Name: name, School: "s"}}
}

// TestInformerAfterOutage checks what the cache and the handlers see across an API
// server outage: the informer tries again at most Backoff's longest wait apart
// (client-go's informers wait up to 30 s, stretched to a minute), a Student deleted
// while it could not watch goes from the cache and reaches the handler as a tombstone,
// one created meanwhile arrives, and it is in line again within two of those waits of
// the API server answering.
func TestInformerAfterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a 20 s outage")
	}
	o := newOutage(student("school", "a"), student("school", "b"))
	informer := New(o.client, metav1.NamespaceAll, func(*metav1.ListOptions) {}, 0, nil, cache.DeletionHandlingMetaNamespaceKeyFunc)
	var mu sync.Mutex
	var added, deleted []string
	if err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			mu.Lock()
			defer mu.Unlock()
			added = append(added, obj.(*studentv1.Student).Name)
		},
		DeleteFunc: func(obj any) {
			mu.Lock()
			defer mu.Unlock()
			tomb, ok := obj.(cache.DeletedFinalStateUnknown)
			if !ok {
				t.Errorf("deleted while no watch was open, yet the handler got a %T, not a tombstone", obj)
				return
			}
			deleted = append(deleted, tomb.Key)
		},
	}); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	var running sync.WaitGroup
	defer running.Wait()
	defer stop()
	running.Go(func() { informer.Run(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the cache did not sync")
	}
	if err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{}); err == nil {
		t.Error("a handler was added to a running informer, which would not hear of the Students it has")
	}

	// A watch that ends within a second of opening is one client-go lists again after;
	// this one has lasted, so it is watched again first, as after a crash.
	for {
		o.mu.Lock()
		opened := o.watchedAt
		o.mu.Unlock()
		if !opened.IsZero() && time.Since(opened) > 1500*time.Millisecond {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	o.start()
	// While it is down, through the tracker (the API server's storage): b goes, c comes.
	gvr := schema.GroupVersionResource{Group: "bolingcavalry.k8s.io", Version: "v1", Resource: "students"}
	if err := o.client.Tracker().Delete(gvr, "school", "b"); err != nil {
		t.Fatal(err)
	}
	if err := o.client.Tracker().Create(gvr, student("school", "c"), "school"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Second)
	o.mu.Lock()
	back := time.Now()
	o.down.Store(false)
	tries := append(slices.Clone(o.tries), back)
	o.mu.Unlock()
	// Tries no further apart than Backoff's longest wait and a second for a busy
	// machine: client-go's own are 6.4 s apart or more from the fifth, which a 20 s
	// outage always reaches. And not more often than every 125 ms.
	longest := Backoff.Cap + Backoff.Cap/2 + time.Second
	if want := int(20*time.Second/longest) - 1; len(tries)-1 < want {
		t.Errorf("%d tries in a 20 s outage, want at least %d", len(tries)-1, want)
	}
	for i := 1; i < len(tries); i++ {
		if gap := tries[i].Sub(tries[i-1]); gap > longest || i < len(tries)-1 && gap < Backoff.Duration/2 {
			t.Errorf("try %d came %v after the one before (want %v to %v; the last is the API server answering again)", i, gap.Round(time.Millisecond), Backoff.Duration/2, longest)
		}
	}

	cached := func(name string) bool {
		_, ok, err := informer.Indexer().GetByKey("school/" + name)
		return ok && err == nil
	}
	// The longest wait before the watch is tried again, the longest before the list
	// that follows its refusal (410 Gone), and two seconds for the rest.
	limit := 2*(Backoff.Cap+Backoff.Cap/2) + 2*time.Second
	for {
		if !cached("b") && cached("c") {
			break
		}
		if time.Since(back) > limit {
			t.Fatalf("the cache still lacks c or holds b %v after the API server answered again (limit %v)", time.Since(back), limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("in line again %v after the API server answered", time.Since(back).Round(time.Millisecond))
	o.mu.Lock()
	if o.expiredAt.Before(back) {
		t.Error("no watch was refused with 410 Gone after the outage: the relist was not the one tested")
	}
	o.mu.Unlock()
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(deleted) != "[school/b]" {
		t.Errorf("tombstones %v, want [school/b]", deleted)
	}
	if fmt.Sprint(added) != "[a b c]" && fmt.Sprint(added) != "[b a c]" {
		t.Errorf("added %v, want a and b, then c", added)
	}
}
