package controller

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/student-controller/student-controller/internal/informer"
	"github.com/student-controller/student-controller/internal/registry"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// Scope is which Students a controller watches: those of Namespaces (all when empty) whose
// labels match Selector (all when nil). The informers ask the API server for these alone.
type Scope struct {
	Namespaces []string
	Selector   labels.Selector
}

// ParseScope reads --namespace (a comma-separated list) and --selector (as kubectl's -l).
func ParseScope(namespaces, selector string) (Scope, error) {
	var s Scope
	for ns := range strings.SplitSeq(namespaces, ",") {
		if ns = strings.TrimSpace(ns); ns == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return Scope{}, fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
		}
		s.Namespaces = append(s.Namespaces, ns)
	}
	if strings.TrimSpace(namespaces) != "" && len(s.Namespaces) == 0 {
		return Scope{}, fmt.Errorf("namespaces %q name none", namespaces)
	}
	slices.Sort(s.Namespaces)
	s.Namespaces = slices.Compact(s.Namespaces)
	if selector != "" {
		sel, err := labels.Parse(selector)
		if err != nil {
			return Scope{}, fmt.Errorf("label selector %q: %w", selector, err)
		}
		if !sel.Empty() {
			s.Selector = sel
		}
	}
	return s, nil
}

// Contains says whether namespace is one of the scope's.
func (s Scope) Contains(namespace string) bool {
	return len(s.Namespaces) == 0 || slices.Contains(s.Namespaces, namespace)
}

// Labeled says whether the scope selects by label: then only the API server tells an
// orphan row from one whose Student is outside the scope.
func (s Scope) Labeled() bool { return s.Selector != nil && !s.Selector.Empty() }

// String says the scope for people: "all namespaces", "namespaces a, b", and labels.
func (s Scope) String() string {
	where := "all namespaces"
	switch len(s.Namespaces) {
	case 0:
	case 1:
		where = "namespace " + s.Namespaces[0]
	default:
		where = "namespaces " + strings.Join(s.Namespaces, ", ")
	}
	if s.Labeled() {
		where += ", labels " + s.Selector.String()
	}
	return where
}

// rowsIn keeps the rows of the scope's namespaces: a row of another is not this
// controller's to judge (its Student is not cached).
func (s Scope) rowsIn(rows []registry.Record) []registry.Record {
	if len(s.Namespaces) == 0 {
		return rows
	}
	return slices.DeleteFunc(rows, func(r registry.Record) bool { return !s.Contains(r.Namespace) })
}

// Informers are a scope's Student informers: one for all namespaces, or one per namespace
// (a watch names one or all), each filtered by its labels. Together they are one cache.
type Informers struct {
	informers map[string]*informer.Informer // by namespace; "" when one has all
	running   sync.WaitGroup
}

// NewInformers returns scope's informers, resynced every resync, which keep what compact
// makes. Add the handlers, call Start, then Shutdown once stop is closed. No namespace
// index: nothing uses it, and it would hold a second set of keys.
func NewInformers(client versioned.Interface, scope Scope, resync time.Duration) *Informers {
	namespaces := scope.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	in := &Informers{informers: make(map[string]*informer.Informer, len(namespaces))}
	tweak := func(*metav1.ListOptions) {}
	if scope.Labeled() {
		selector := scope.Selector.String()
		tweak = func(o *metav1.ListOptions) { o.LabelSelector = selector }
	}
	for _, ns := range namespaces {
		in.informers[ns] = informer.New(client, ns, tweak, resync, compact, cacheKey)
	}
	return in
}

// Start starts every informer; they stop when stop is closed.
func (in *Informers) Start(stop <-chan struct{}) {
	ctx := wait.ContextForChannel(stop)
	for _, i := range in.informers {
		in.running.Go(func() { i.Run(ctx) })
	}
}

// Shutdown waits for every informer to stop, once Start's stop channel is closed.
func (in *Informers) Shutdown() { in.running.Wait() }

// HasSynced says whether every informer has synced.
func (in *Informers) HasSynced() bool {
	for _, i := range in.informers {
		if !i.HasSynced() {
			return false
		}
	}
	return true
}

// addEventHandler adds handler to every informer, before Start.
func (in *Informers) addEventHandler(handler cache.ResourceEventHandler) error {
	for _, i := range in.informers {
		if err := i.AddEventHandler(handler); err != nil {
			return err
		}
	}
	return nil
}

// indexer is the cache of namespace's Students; nil for a namespace outside the scope.
func (in *Informers) indexer(namespace string) cache.Indexer {
	if i, ok := in.informers[metav1.NamespaceAll]; ok {
		return i.Indexer()
	}
	if i, ok := in.informers[namespace]; ok {
		return i.Indexer()
	}
	return nil
}

// Put adds s to the cache as a watch would; it fails outside the scope. For tests.
func (in *Informers) Put(s *studentv1.Student) error {
	indexer := in.indexer(s.Namespace)
	if indexer == nil {
		return fmt.Errorf("namespace %s is outside the scope", s.Namespace)
	}
	return indexer.Update(compactStudent(s))
}

// Remove removes the Student namespace/name from the cache, as a watch would.
func (in *Informers) Remove(namespace, name string) error {
	indexer := in.indexer(namespace)
	if indexer == nil {
		return nil
	}
	obj, exists, err := indexer.GetByKey(cache.NewObjectName(namespace, name).String())
	if err != nil || !exists {
		return err
	}
	return indexer.Delete(obj)
}

// get returns the cached Student namespace/name, or false.
func (in *Informers) get(namespace, name string) (*cachedStudent, bool) {
	indexer := in.indexer(namespace)
	if indexer == nil {
		return nil, false
	}
	obj, exists, _ := indexer.GetByKey(cache.NewObjectName(namespace, name).String()) // a key lookup never fails
	if !exists {
		return nil, false
	}
	return asCached(obj), true
}

// list returns every cached Student.
func (in *Informers) list() []*cachedStudent {
	var all []*cachedStudent
	for _, i := range in.informers {
		for _, obj := range i.Indexer().List() {
			all = append(all, asCached(obj))
		}
	}
	return all
}

// asCached is a cached object as a cachedStudent. A Student that reached the cache some
// other way is made compact, not taken for gone (its row would look orphaned).
func asCached(obj any) *cachedStudent {
	switch o := obj.(type) {
	case *cachedStudent:
		return o
	case *studentv1.Student:
		return compactStudent(o)
	}
	panic(fmt.Sprintf("the Student cache holds a %T", obj))
}
