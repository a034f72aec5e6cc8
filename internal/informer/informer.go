// Package informer keeps the Students of a namespace in a cache, as client-go's
// SharedIndexInformer does, with a backoff of its own while the API server does not
// answer.
package informer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// Backoff is how long an informer waits between tries while the API server does not
// answer, and before it lists again after a watch ended: from 250 ms, doubling, at
// most 2 s, each wait stretched by up to half again so that replicas do not call in
// step. So it is in line again within about 3 s of the API server answering (and the
// list), at about one request every 2 to 3 s while it is down; a watch that keeps
// ending while lists work costs a list every 2 to 3 s. client-go's informers wait up
// to 30 s, stretched to up to a minute, and the wait grows across outages until two
// minutes have passed since it last started over; a SharedIndexInformer cannot be
// given another backoff (client-go's TODO #136943), which is why this informer is
// built from client-go's parts.
var Backoff = wait.Backoff{
	Duration: 250 * time.Millisecond,
	Factor:   2,
	Jitter:   0.5,
	Cap:      2 * time.Second,
	Steps:    math.MaxInt32,
}

// Informer keeps the Students of one namespace (every namespace for "") that match the
// scope's labels in a cache, from client-go's parts as its SharedIndexInformer is built
// (a reflector fills a RealFIFO, whose known objects are the cache, and one loop
// applies each change to the cache in watch order, then tells the handlers), with two
// differences: the reflector's backoff is Backoff, and a relist reaches the cache one
// Student at a time rather than at once (the sweep asks the API server before it calls
// a row an orphan, so a cache half through a relist costs a request, not a row).
// Handlers are added before Run; they run on that one loop, holding the queue, so they
// must be quick and must not wait on HasSynced (the controller's only queue keys).
type Informer struct {
	indexer   cache.Indexer
	fifo      *cache.RealFIFO
	reflector *cache.Reflector

	mu       sync.Mutex
	handlers []cache.ResourceEventHandler
	started  bool
}

// New returns the informer of the Students of namespace (every namespace for ""):
// tweak sets the options of its lists and watches (a label selector), resync is how
// often the handlers hear of every cached Student again (never for 0), and transform
// makes each Student what the cache keeps (it must pass what it made through
// untouched: a resync hands it the cache's own objects). key is the cache's key
// function; it must take a Student, what transform makes, and a tombstone (a Student
// deleted while no watch was open), whose key is the one it carries.
func New(client versioned.Interface, namespace string, tweak func(*metav1.ListOptions), resync time.Duration,
	transform cache.TransformFunc, key cache.KeyFunc) *Informer {
	indexer := cache.NewIndexer(key, cache.Indexers{})
	fifo := cache.NewRealFIFOWithOptions(cache.RealFIFOOptions{
		KeyFunction:  key,
		KnownObjects: indexer,
		Transformer:  transform,
	})
	// As the SharedIndexInformer does: a resync more often than every second would
	// hold the queue all the time.
	if resync > 0 && resync < time.Second {
		resync = time.Second
	}
	students := client.BolingcavalryV1().Students(namespace)
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			tweak(&opts)
			return students.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			tweak(&opts)
			return students.Watch(ctx, opts)
		},
	}, client)
	backoff := Backoff
	name := "Students of every namespace"
	if namespace != metav1.NamespaceAll {
		name = fmt.Sprintf("Students of namespace %s", namespace)
	}
	return &Informer{
		indexer: indexer,
		fifo:    fifo,
		reflector: cache.NewReflectorWithOptions(lw, &studentv1.Student{}, fifo, cache.ReflectorOptions{
			Name: name, TypeDescription: "*v1.Student", ResyncPeriod: resync, Backoff: &backoff,
		}),
	}
}

// AddEventHandler adds handler; it fails once the informer runs.
func (i *Informer) AddEventHandler(handler cache.ResourceEventHandler) error {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.started {
		return errors.New("the Student informer already runs: add its handlers before it starts")
	}
	i.handlers = append(i.handlers, handler)
	return nil
}

// Run fills the cache and tells the handlers until ctx ends.
func (i *Informer) Run(ctx context.Context) {
	i.mu.Lock()
	if i.started {
		i.mu.Unlock()
		return // a reflector and a queue run once
	}
	i.started = true
	handlers := i.handlers
	i.mu.Unlock()

	var reflecting sync.WaitGroup
	reflecting.Go(func() { i.reflector.RunWithContext(ctx) })
	defer reflecting.Wait()
	go func() {
		<-ctx.Done()
		i.fifo.Close()
	}()
	for ctx.Err() == nil {
		_, err := i.fifo.Pop(func(obj any, isInInitialList bool) error {
			deltas, ok := obj.(cache.Deltas)
			if !ok {
				return fmt.Errorf("the Student informer's queue held a %T", obj)
			}
			return i.apply(deltas, isInInitialList, handlers)
		})
		switch {
		case errors.Is(err, cache.ErrFIFOClosed):
			return
		case err != nil:
			utilruntime.HandleErrorWithContext(ctx, err, "Student cache not updated")
		}
	}
}

// apply makes the cache what deltas say, oldest first, and tells the handlers each
// change, as client-go's informers do.
func (i *Informer) apply(deltas cache.Deltas, isInInitialList bool, handlers []cache.ResourceEventHandler) error {
	for _, d := range deltas {
		switch d.Type {
		case cache.Sync, cache.Replaced, cache.Added, cache.Updated:
			old, exists, err := i.indexer.Get(d.Object)
			if err != nil {
				return err
			}
			if exists {
				if err := i.indexer.Update(d.Object); err != nil {
					return err
				}
				for _, h := range handlers {
					h.OnUpdate(old, d.Object)
				}
				continue
			}
			if err := i.indexer.Add(d.Object); err != nil {
				return err
			}
			for _, h := range handlers {
				h.OnAdd(d.Object, isInInitialList)
			}
		case cache.Deleted:
			if err := i.indexer.Delete(d.Object); err != nil {
				return err
			}
			for _, h := range handlers {
				h.OnDelete(d.Object)
			}
		}
	}
	return nil
}

// HasSynced says whether the first list has reached the cache and the handlers.
func (i *Informer) HasSynced() bool { return i.fifo.HasSynced() }

// Indexer is the cache.
func (i *Informer) Indexer() cache.Indexer { return i.indexer }
