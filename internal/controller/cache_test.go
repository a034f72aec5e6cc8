package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/student-controller/student-controller/internal/decide"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned/fake"
)

// decoded returns a Student as the informer gets it: decoded from JSON, so that no
// string shares memory with another object's.
func decoded(t testing.TB, name string, opts ...studentOption) *studentv1.Student {
	t.Helper()
	s := newStudent(name, append([]studentOption{func(s *studentv1.Student) {
		s.Finalizers = []string{Finalizer}
		s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate}}
		s.Status.Conditions = []metav1.Condition{{Type: studentv1.ConditionReady, Status: metav1.ConditionTrue,
			Reason: studentv1.ReasonSynced, Message: "The registry row matches the spec"}}
		s.Status.Registry = &studentv1.RegistryStatus{Owner: "student-controller", WrittenGeneration: 1}
	}}, opts...)...)
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

// kept is what the cache keeps of s: what compactStudent(s).student() should give.
func kept(s *studentv1.Student) *studentv1.Student {
	want := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: s.Namespace, Name: s.Name, UID: s.UID, ResourceVersion: s.ResourceVersion,
			Generation: s.Generation, DeletionTimestamp: s.DeletionTimestamp, Finalizers: s.Finalizers,
		},
		Spec: s.Spec, Status: s.Status,
	}
	for _, a := range []string{studentv1.AnnotationPaused, studentv1.AnnotationReconcileRequestedAt} {
		if v := s.Annotations[a]; v != "" && (a != studentv1.AnnotationPaused || v == "true") {
			annotated(a, v)(want)
		}
	}
	return want
}

// TestCompact: the cache keeps every field that the controller reads of a Student, as
// it was, whatever its form, and nothing else; what Students share it keeps once.
func TestCompact(t *testing.T) {
	const uid = "0b6f5e3c-4a51-4f39-9b1e-6d2f0b1c8a77"
	at := func(sec int64) *metav1.Time { t := metav1.Unix(sec, 0); return &t }
	fromAPIServer := func(s *studentv1.Student) {
		s.UID, s.ResourceVersion = uid, "48213"
		s.Labels = map[string]string{"team": "a"}
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "y"}}
	}
	policy := func(p studentv1.DeletionPolicy) studentOption {
		return func(s *studentv1.Student) { s.Spec.DeletionPolicy = p }
	}
	tests := map[string][]studentOption{
		"as the API server makes it":   {fromAPIServer},
		"a UID of another form":        {func(s *studentv1.Student) { s.UID = "uid-a" }},
		"an upper-case UUID":           {func(s *studentv1.Student) { s.UID = "0B6F5E3C-4A51-4F39-9B1E-6D2F0B1C8A77" }},
		"the nil UUID":                 {func(s *studentv1.Student) { s.UID = "00000000-0000-0000-0000-000000000000" }},
		"no UID, no resourceVersion":   {func(s *studentv1.Student) { s.UID, s.ResourceVersion = "", "" }},
		"resourceVersion 0":            {func(s *studentv1.Student) { s.ResourceVersion = "0" }},
		"resourceVersion 007":          {func(s *studentv1.Student) { s.ResourceVersion = "007" }},
		"resourceVersion not a number": {func(s *studentv1.Student) { s.ResourceVersion = "a1" }},
		"resourceVersion past uint64":  {func(s *studentv1.Student) { s.ResourceVersion = "18446744073709551616" }},
		"deleting":                     {fromAPIServer, deleting},
		"no finalizer":                 {func(s *studentv1.Student) { s.Finalizers = nil }},
		"other finalizers":             {func(s *studentv1.Student) { s.Finalizers = []string{"example.com/a", Finalizer} }},
		"paused":                       {annotated(studentv1.AnnotationPaused, "true")},
		"a paused annotation not true": {annotated(studentv1.AnnotationPaused, "yes")},
		"a reconcile request":          {annotated(studentv1.AnnotationReconcileRequestedAt, "1"), annotated("example.com/note", "x")},
		"a reconcile request handled": {func(s *studentv1.Student) {
			annotated(studentv1.AnnotationReconcileRequestedAt, "2")(s)
			s.Status.LastHandledReconcileAt = "2"
		}},
		"no status": {func(s *studentv1.Student) { s.Status = studentv1.StudentStatus{} }},
		"two conditions": {func(s *studentv1.Student) {
			s.Status.Conditions = append(s.Status.Conditions, metav1.Condition{Type: studentv1.ConditionSynced, Status: metav1.ConditionFalse,
				Reason: studentv1.ReasonPaused, LastTransitionTime: *at(7)})
		}},
		"three conditions, in their order": {func(s *studentv1.Student) {
			s.Status.Conditions = []metav1.Condition{{Type: "C", LastTransitionTime: *at(3)}, {Type: "B"}, {Type: "A", Message: "m"}}
		}},
		"registry never written":        {func(s *studentv1.Student) { s.Status.Registry = &studentv1.RegistryStatus{Owner: "o"} }},
		"registry written":              {func(s *studentv1.Student) { s.Status.Registry.LastWrittenTime = at(1700000000) }},
		"an empty registry":             {func(s *studentv1.Student) { s.Status.Registry = &studentv1.RegistryStatus{} }},
		"an orphan policy":              {orphan},
		"observed":                      {func(s *studentv1.Student) { s.Spec.Management = studentv1.ManagementObserve }},
		"managed":                       {func(s *studentv1.Student) { s.Spec.Management = studentv1.ManagementManage }},
		"a management of no known kind": {func(s *studentv1.Student) { s.Spec.Management = "watch" }},
		"a delete policy":               {fromAPIServer, policy(studentv1.DeletionPolicyDelete)},
		"no policy":                     {fromAPIServer, policy("")},
		"a policy of no kind":           {fromAPIServer, policy("Sometimes")},
		"no namespace":                  {func(s *studentv1.Student) { s.Namespace = "" }},
	}
	for name, opts := range tests {
		t.Run(name, func(t *testing.T) {
			s := decoded(t, "a", opts...)
			want := kept(s)
			c := compactStudent(s)
			got := c.student()
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the cached Student (-want +got):\n%s", diff)
			}
			if want, _ := cache.MetaNamespaceKeyFunc(s); c.key != want {
				t.Errorf("key %q; want %q, as the cache's key function makes it", c.key, want)
			}
			if paused(got) != paused(s) || reconcileRequest(got) != reconcileRequest(s) || c.isPaused() != paused(s) {
				t.Errorf("steering: paused %v, request %q; want %v, %q", paused(got), reconcileRequest(got), paused(s), reconcileRequest(s))
			}
			if c.deleting() != (s.DeletionTimestamp != nil) {
				t.Errorf("deleting %v; want %v", c.deleting(), s.DeletionTimestamp != nil)
			}
			if got := decide.Want(owner, c.facts()); got != recordOf(owner, s) {
				t.Errorf("record %+v; want %+v", got, recordOf(owner, s))
			}
			if key, err := cacheKey(c); err != nil || key != c.key {
				t.Errorf("cacheKey = %q, %v; want %q", key, err, c.key)
			}
			// A new object each time, which the sync may change.
			got.Finalizers = append(got.Finalizers[:0], "changed")
			got.Status.Conditions = append(got.Status.Conditions[:0], metav1.Condition{Type: "changed"})
			if diff := cmp.Diff(want, c.student()); diff != "" {
				t.Errorf("a change to one Student made of the cache's changed the next (-want +got):\n%s", diff)
			}
		})
	}
	// A known deletion policy costs no rare fields.
	for _, p := range []studentv1.DeletionPolicy{studentv1.DeletionPolicyDelete, studentv1.DeletionPolicyOrphan, ""} {
		if c := compactStudent(decoded(t, "a", fromAPIServer, policy(p))); c.rare != nil {
			t.Errorf("policy %q: rare fields %+v, want none", p, c.rare)
		}
	}
}

// TestCompactShares: what many Students share is kept once.
func TestCompactShares(t *testing.T) {
	// unique.Make shares a value only while a handle to it lives: none may be
	// collected between the two Students.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	written := func(s *studentv1.Student) {
		s.UID, s.ResourceVersion = types.UID(uuid.NewString()), "48213"
		at := metav1.Unix(1700000000, 0)
		s.Status.Registry.LastWrittenTime = &at
		s.Status.Conditions[0].LastTransitionTime = at
	}
	a, b := compactStudent(decoded(t, "a", written)), compactStudent(decoded(t, "b", written))
	if unsafe.StringData(a.school) != unsafe.StringData(b.school) {
		t.Error("two copies of the school; want one shared")
	}
	if a.conditions != b.conditions || a.registry != b.registry {
		t.Error("two copies of the same conditions or registry facts; want one shared")
	}
	if a.rare != nil || b.rare != nil {
		t.Errorf("a Student as the API server makes it keeps rare fields: %+v", a.rare)
	}
}

// TestCompactPassesThrough: the transform leaves alone what it made (a resync hands the
// cache's own objects back) and anything that is not a Student.
func TestCompactPassesThrough(t *testing.T) {
	c := compactStudent(decoded(t, "a"))
	other := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "x", ManagedFields: []metav1.ManagedFieldsEntry{{}}}}
	for _, obj := range []any{c, other, nil, (*studentv1.Student)(nil)} {
		if out, err := compact(obj); err != nil || out != obj {
			t.Errorf("compact(%T) = %v, %v; want it passed through untouched", obj, out, err)
		}
	}
	if len(other.ManagedFields) != 1 {
		t.Error("compact changed an object that is not a Student")
	}
	s := decoded(t, "a")
	if key, err := cacheKey(s); err != nil || key != "school/a" {
		t.Errorf("cacheKey(a Student) = %q, %v; want school/a", key, err)
	}
	if key, err := cacheKey(cache.DeletedFinalStateUnknown{Key: "school/gone", Obj: c}); err != nil || key != "school/gone" {
		t.Errorf("cacheKey(a tombstone) = %q, %v; want the key it carries", key, err)
	}
}

// BenchmarkCachedStudent reports what one Student costs in the cache, as decoded from
// the watch (with the managed fields that the API server sends) and as the cache keeps
// it, in heap bytes per Student over 10000 of them, with their keys in the cache.
func BenchmarkCachedStudent(b *testing.B) {
	const n = 10000
	students := make([]*studentv1.Student, n)
	for i := range students {
		s := newStudent(fmt.Sprintf("student-%05d", i), synced(start))
		s.UID, s.ResourceVersion = types.UID(uuid.NewString()), fmt.Sprint(100000+i)
		s.Finalizers = []string{Finalizer}
		s.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "loader", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "bolingcavalry.k8s.io/v1", FieldsType: "FieldsV1", FieldsV1: metav1.NewFieldsV1(`{"f:spec":{"f:name":{},"f:school":{}}}`)}}
		students[i] = s
	}
	encoded := make([][]byte, n)
	for i, s := range students {
		var err error
		if encoded[i], err = json.Marshal(s); err != nil {
			b.Fatal(err)
		}
	}
	fill := func(transform func(*studentv1.Student) any) float64 {
		before := heap()
		store := cache.NewIndexer(cacheKey, cache.Indexers{})
		for _, e := range encoded {
			s := &studentv1.Student{}
			if err := json.Unmarshal(e, s); err != nil {
				b.Fatal(err)
			}
			if err := store.Add(transform(s)); err != nil {
				b.Fatal(err)
			}
		}
		per := float64(heap()-before) / n
		goruntime.KeepAlive(store)
		return per
	}
	var decodedBytes, cachedBytes float64
	for b.Loop() {
		decodedBytes = fill(func(s *studentv1.Student) any { return s })
		cachedBytes = fill(func(s *studentv1.Student) any { return compactStudent(s) })
	}
	b.ReportMetric(decodedBytes, "decoded-B/student")
	b.ReportMetric(cachedBytes, "cached-B/student")
	b.ReportMetric(float64(unsafe.Sizeof(cachedStudent{})), "struct-B")
}

// BenchmarkQueueAfterBacklog reports what the workqueue keeps per key once a backlog of
// 10000 keys (every Student, as at start) has drained: its maps keep the room they grew
// to. The keys themselves are the cache's strings.
func BenchmarkQueueAfterBacklog(b *testing.B) {
	const n = 10000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("school/student-%05d", i)
	}
	var per float64
	for b.Loop() {
		before := heap()
		q := workqueue.NewTypedRateLimitingQueue(DefaultRateLimiter())
		for _, k := range keys {
			q.Add(k)
		}
		for range keys {
			k, _ := q.Get()
			q.Forget(k)
			q.Done(k)
		}
		per = float64(heap()-before) / n
		q.ShutDown()
	}
	b.ReportMetric(per, "kept-B/key")
}

// heap is the heap in use after a collection.
func heap() uint64 {
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestInformers: the informers of a scope cache its Students alone, compact and with no
// index; get finds each by key and list lists them all.
func TestInformers(t *testing.T) {
	in := func(ns string, labels ...string) studentOption {
		return func(s *studentv1.Student) {
			s.Namespace, s.UID = ns, types.UID(ns+"-"+s.Name)
			if len(labels) == 2 {
				s.Labels = map[string]string{labels[0]: labels[1]}
			}
		}
	}
	objects := []runtime.Object{decoded(t, "a"), decoded(t, "b", in("college")), decoded(t, "c", in("other")),
		decoded(t, "d", in("school", "team", "x")), decoded(t, "e", in("college", "team", "y"))}
	tests := map[string]struct {
		namespaces, selector string
		want                 []string
	}{
		"all":                                    {want: []string{"college/b", "college/e", "other/c", "school/a", "school/d"}},
		"one namespace":                          {namespaces: "school", want: []string{"school/a", "school/d"}},
		"two namespaces":                         {namespaces: "school,college", want: []string{"college/b", "college/e", "school/a", "school/d"}},
		"two namespaces and a selector":          {namespaces: "college, school", selector: "team", want: []string{"college/e", "school/d"}},
		"every namespace, a selector":            {selector: "team=x", want: []string{"school/d"}},
		"a selector that excludes a label value": {selector: "team!=x", want: []string{"college/b", "college/e", "other/c", "school/a"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			scope, err := ParseScope(tc.namespaces, tc.selector)
			if err != nil {
				t.Fatal(err)
			}
			informers := NewInformers(fake.NewSimpleClientset(objects...), scope, 0)
			for _, i := range informers.informers {
				if indexers := i.Indexer().GetIndexers(); len(indexers) != 0 {
					t.Errorf("informer indexes %v; want no index", slices.Collect(maps.Keys(indexers)))
				}
			}
			ctx, stop := context.WithCancel(t.Context())
			defer informers.Shutdown()
			defer stop()
			informers.Start(ctx.Done())
			if !cache.WaitForCacheSync(ctx.Done(), informers.HasSynced) {
				t.Fatal("the caches did not sync")
			}
			var got []string
			for _, s := range informers.list() {
				got = append(got, s.key)
			}
			slices.Sort(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("cached Students (-want +got):\n%s", diff)
			}
			for _, o := range objects {
				s := o.(*studentv1.Student)
				key := s.Namespace + "/" + s.Name
				c, found := informers.get(s.Namespace, s.Name)
				if cached := slices.Contains(tc.want, key); found != cached || found && c.key != key {
					t.Errorf("get %s: found %v; want it found only when in scope", key, found)
				}
			}
		})
	}
}

// TestParseScope: --namespace and --selector as the controller reads them.
func TestParseScope(t *testing.T) {
	tests := map[string]struct {
		namespaces, selector string
		want                 string // Scope.String, or the error
	}{
		"none":                    {want: "all namespaces"},
		"one":                     {namespaces: "school", want: "namespace school"},
		"several, sorted, unique": {namespaces: "school, college,school", want: "namespaces college, school"},
		"a selector":              {namespaces: "school", selector: "team in (a,b),!retired", want: "namespace school, labels !retired,team in (a,b)"},
		"commas alone":            {namespaces: " , ", want: `namespaces " , " name none`},
		"a bad name":              {namespaces: "school,Big_School", want: `namespace "Big_School": a lowercase RFC 1123 label`},
		"a bad selector":          {selector: "team in (a", want: `label selector "team in (a"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			scope, err := ParseScope(tc.namespaces, tc.selector)
			got := scope.String()
			if err != nil {
				got = err.Error()
			}
			if !strings.HasPrefix(got, tc.want) {
				t.Errorf("ParseScope(%q, %q) = %q; want %q", tc.namespaces, tc.selector, got, tc.want)
			}
		})
	}
}
