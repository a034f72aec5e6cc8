package controller

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

// RequiredFields are the Student fields this controller reads or writes, as CRD schema
// paths. The API server drops a field the CRD lacks from every write (spec.management: an
// observed Student would be managed), so nothing is written until the CRD is upgraded.
var RequiredFields = []string{
	"spec.name", "spec.school", "spec.deletionPolicy", "spec.management",
	"status.observedGeneration", "status.conditions", "status.lastHandledReconcileAt",
	"status.registry.owner", "status.registry.lastWrittenTime", "status.registry.writtenGeneration",
}

// crdResource is where the API server serves CRDs.
var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// CRDTooOldError says which fields the served Student CRD lacks.
type CRDTooOldError struct{ Missing []string }

func (e *CRDTooOldError) Error() string {
	return fmt.Sprintf("the Student CRD is older than this controller: its schema lacks %s, which the API server would drop from every write. "+
		"Apply this version's CRD (kubectl apply -k config/crd, or helm upgrade --take-ownership with crds.enabled), and the controller goes on",
		strings.Join(e.Missing, ", "))
}

// CheckCRD reads the served Student CRD; a *CRDTooOldError names the fields it lacks.
func CheckCRD(ctx context.Context, client dynamic.Interface) error {
	crd, err := client.Resource(crdResource).Get(ctx, crdName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read the Student CRD: %w", err)
	}
	if missing := MissingFields(crd); len(missing) > 0 {
		return &CRDTooOldError{Missing: missing}
	}
	return nil
}

// MissingFields are the RequiredFields the CRD's served schema of this version lacks.
func MissingFields(crd *unstructured.Unstructured) []string {
	versions, _, _ := unstructured.NestedSlice(crd.Object, "spec", "versions")
	var root map[string]any
	for _, v := range versions {
		version, ok := v.(map[string]any)
		if ok && version["name"] == studentv1.SchemeGroupVersion.Version && version["served"] == true {
			root, _, _ = unstructured.NestedMap(version, "schema", "openAPIV3Schema")
		}
	}
	var missing []string
	for _, field := range RequiredFields {
		path := []string{}
		for _, name := range strings.Split(field, ".") {
			path = append(path, "properties", name)
		}
		if _, found, _ := unstructured.NestedMap(root, path...); !found {
			missing = append(missing, field)
		}
	}
	return missing
}

// crdWatch follows the served CRD while the controller runs: an older one applied
// meanwhile (a rollback, an old GitOps tree) would drop fields, so while it is served
// nothing is written for a live Student and the Pod is not ready. A current CRD coming
// back resyncs every Student.
type crdWatch struct {
	informer cache.SharedIndexInformer
	older    atomic.Pointer[CRDTooOldError]
	current  func() // called when the CRD is current again
}

// newCRDWatch watches the Student CRD alone: a field selector on its name, as RBAC allows.
func newCRDWatch(client dynamic.Interface) *crdWatch {
	w := &crdWatch{}
	w.informer = dynamicinformer.NewFilteredDynamicInformer(client, crdResource, "", 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.FieldSelector = "metadata.name=" + crdName }).Informer()
	_, _ = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.seen,
		UpdateFunc: func(_, obj any) { w.seen(obj) },
	})
	return w
}

// seen takes in the CRD as the API server now serves it.
func (w *crdWatch) seen(obj any) {
	crd, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	if missing := MissingFields(crd); len(missing) > 0 {
		w.older.Store(&CRDTooOldError{Missing: missing})
		return
	}
	if w.older.Swap(nil) != nil && w.current != nil {
		w.current()
	}
}

// Older is a *CRDTooOldError while the served CRD is too old; else (or unwatched) nil.
func (w *crdWatch) Older() error {
	if w == nil {
		return nil
	}
	if e := w.older.Load(); e != nil {
		return e
	}
	return nil
}
