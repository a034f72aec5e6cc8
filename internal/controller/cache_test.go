package controller

import (
	"context"
	"encoding/json"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned/fake"
)

// decoded returns a Student as the informer gets it: decoded from JSON, so that no
// string shares memory with another object's.
func decoded(t *testing.T, name string, opts ...studentOption) *studentv1.Student {
	t.Helper()
	s := newStudent(name, opts...)
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

// TestInformers: the informers of a scope cache its Students alone, trimmed and with no
// index; their lister finds each by key and lists them all.
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
			lister := informers.Lister()
			list, err := lister.List(labels.Everything())
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range list {
				got = append(got, s.Namespace+"/"+s.Name)
				if s.ManagedFields != nil {
					t.Errorf("cached %s/%s with managedFields; want them trimmed", s.Namespace, s.Name)
				}
			}
			slices.Sort(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("cached Students (-want +got):\n%s", diff)
			}
			for _, o := range objects {
				s := o.(*studentv1.Student)
				key := s.Namespace + "/" + s.Name
				_, err := lister.Students(s.Namespace).Get(s.Name)
				if cached := slices.Contains(tc.want, key); cached && err != nil || !cached && !apierrors.IsNotFound(err) {
					t.Errorf("Get %s: %v; want it found only when in scope, NotFound otherwise", key, err)
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
