package controller

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	metadatafake "k8s.io/client-go/metadata/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestCRDDeletingFollowsTheCRD: "the CRD is being deleted" holds for the CRD object
// that was being deleted, not for the life of the process. Once the CRD is applied
// again (a new object, a new UID), a Delete Student's finalizer deletes its row again.
func TestCRDDeletingFollowsTheCRD(t *testing.T) {
	crd := func(uid string, deleting bool) *metav1.PartialObjectMetadata {
		m := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: crdName, UID: types.UID(uid)}}
		if deleting {
			now := metav1.NewTime(time.Unix(1, 0))
			m.DeletionTimestamp = &now
		}
		return m
	}
	var served *metav1.PartialObjectMetadata // nil: not found
	client := metadatafake.NewSimpleMetadataClient(metadatafake.NewTestScheme())
	client.PrependReactor("get", "customresourcedefinitions", func(k8stesting.Action) (bool, runtime.Object, error) {
		if served == nil {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}, crdName)
		}
		return true, served, nil
	})
	ask := crdDeleting(client)
	for _, step := range []struct {
		name   string
		served *metav1.PartialObjectMetadata
		want   bool
	}{
		{"the CRD served", crd("one", false), false},
		{"the CRD being deleted", crd("one", true), true},
		{"the CRD gone", nil, true},
		{"the CRD applied again", crd("two", false), false},
	} {
		served = step.served
		got, err := ask(context.Background())
		if err != nil || got != step.want {
			t.Errorf("%s: deleting %v, %v; want %v", step.name, got, err, step.want)
		}
	}
}
