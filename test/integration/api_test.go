package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv"
	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
)

func TestCRDInstalled(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	client := apiextensionsclient.NewForConfigOrDie(env.Config)

	crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(ctx, "students.bolingcavalry.k8s.io", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get CRD: %v", err)
	}
	got := crd.Status.AcceptedNames
	want := apiextensionsv1.CustomResourceDefinitionNames{
		Plural: "students", Singular: "student", ShortNames: []string{"stu"},
		Kind: "Student", ListKind: "StudentList", Categories: []string{"school"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("accepted names (-want +got):\n%s", diff)
	}
	for _, cond := range []apiextensionsv1.CustomResourceDefinitionConditionType{apiextensionsv1.Established, apiextensionsv1.NamesAccepted} {
		if !crdCondition(crd, cond) {
			t.Errorf("CRD condition %s is not True: %+v", cond, crd.Status.Conditions)
		}
	}
	// The group ends in .k8s.io: without an approval annotation the API server refuses
	// the CRD, and with an "unapproved..." one it reports that approval is missing.
	if v := crd.Annotations["api-approved.kubernetes.io"]; !strings.HasPrefix(v, "unapproved") {
		t.Errorf("annotation api-approved.kubernetes.io = %q, want a value starting with unapproved", v)
	}
	if crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("scope = %s, want Namespaced", crd.Spec.Scope)
	}
	if v := crd.Spec.Versions; len(v) != 1 || v[0].Name != "v1" || v[0].Subresources == nil || v[0].Subresources.Status == nil {
		t.Errorf("versions = %+v, want only v1 with the status subresource", v)
	}
}

func crdCondition(crd *apiextensionsv1.CustomResourceDefinition, t apiextensionsv1.CustomResourceDefinitionConditionType) bool {
	for _, c := range crd.Status.Conditions {
		if c.Type == t {
			return c.Status == apiextensionsv1.ConditionTrue
		}
	}
	return false
}

// TestClassicManifest: the manifest that the original controller's users wrote is
// accepted and reads back unchanged; deletionPolicy, which it does not name, reads back
// as its documented default.
func TestClassicManifest(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	ns := testenv.Namespace(t, c.kube, "test-")

	raw, err := os.ReadFile(filepath.Join(env.Root, "config", "samples", "zhang-san.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var sample studentv1.Student
	if err := yaml.UnmarshalStrict(raw, &sample); err != nil {
		t.Fatalf("decode sample: %v", err)
	}
	if sample.Spec.Name != "张三" || sample.Spec.School != "深圳中学" {
		t.Fatalf("the sample is not the classic manifest: %+v", sample.Spec)
	}
	sample.Namespace = ns

	students := c.student.BolingcavalryV1().Students(ns)
	if _, err := students.Create(ctx, &sample, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Fatalf("create: %v", err)
	}
	got, err := students.Get(ctx, "zhang-san", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	want := studentv1.StudentSpec{Name: "张三", School: "深圳中学", DeletionPolicy: studentv1.DeletionPolicyDelete, Management: studentv1.ManagementManage}
	if diff := cmp.Diff(want, got.Spec); diff != "" {
		t.Errorf("spec read back (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(studentv1.StudentStatus{}, got.Status); diff != "" {
		t.Errorf("a new object has status (-want +got):\n%s", diff)
	}
}

// TestValidation: every invalid shape is refused by the API server, with a message
// that names the field, and nothing is stored.
func TestValidation(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	ns := testenv.Namespace(t, c.kube, "test-")

	valid := func() map[string]any { return map[string]any{"name": "张三", "school": "深圳中学"} }
	with := func(key string, value any) map[string]any {
		spec := valid()
		spec[key] = value
		return spec
	}
	without := func(key string) map[string]any {
		spec := valid()
		delete(spec, key)
		return spec
	}

	tests := map[string]struct {
		spec   any // the whole spec; omitted when nil
		strict bool
		want   []string // substrings of the error message
	}{
		"missing spec":          {want: []string{"spec: Required value"}},
		"spec not an object":    {spec: "张三", want: []string{"spec: Invalid value", "must be of type object"}},
		"missing name":          {spec: without("name"), want: []string{"spec.name: Required value"}},
		"missing school":        {spec: without("school"), want: []string{"spec.school: Required value"}},
		"empty name":            {spec: with("name", ""), want: []string{"spec.name: Invalid value", "at least 1 chars long"}},
		"empty school":          {spec: with("school", ""), want: []string{"spec.school: Invalid value", "at least 1 chars long"}},
		"blank name":            {spec: with("name", " \t "), want: []string{"spec.name: Invalid value", "must not be blank"}},
		"blank school":          {spec: with("school", "   "), want: []string{"spec.school: Invalid value", "must not be blank"}},
		"name not a string":     {spec: with("name", 42), want: []string{"spec.name: Invalid value", "must be of type string"}},
		"school not a string":   {spec: with("school", true), want: []string{"spec.school: Invalid value", "must be of type string"}},
		"name null":             {spec: with("name", nil), want: []string{"spec.name"}},
		"name too long":         {spec: with("name", strings.Repeat("张", 129)), want: []string{"spec.name: Too long", "128"}},
		"school too long":       {spec: with("school", strings.Repeat("x", 257)), want: []string{"spec.school: Too long", "256"}},
		"unknown policy":        {spec: with("deletionPolicy", "Keep"), want: []string{"spec.deletionPolicy: Unsupported value: \"Keep\"", "\"Delete\"", "\"Orphan\""}},
		"policy in lower case":  {spec: with("deletionPolicy", "delete"), want: []string{"spec.deletionPolicy: Unsupported value: \"delete\""}},
		"policy not a string":   {spec: with("deletionPolicy", 1), want: []string{"spec.deletionPolicy: Invalid value", "must be of type string"}},
		"unknown field, strict": {spec: with("age", 16), strict: true, want: []string{"unknown field \"spec.age\""}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "bolingcavalry.k8s.io/v1",
				"kind":       "Student",
				"metadata":   map[string]any{"name": "bad"},
			}}
			if tc.spec != nil {
				obj.Object["spec"] = tc.spec
			}
			opts := metav1.CreateOptions{}
			if tc.strict {
				opts.FieldValidation = metav1.FieldValidationStrict
			}
			_, err := c.dynamic.Resource(studentv1.SchemeGroupVersion.WithResource("students")).Namespace(ns).Create(ctx, obj, opts)
			if err == nil {
				t.Fatal("the API server accepted an invalid Student")
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
				t.Errorf("error is %v (reason %s), want Invalid or BadRequest", err, apierrors.ReasonForError(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if _, err := c.student.BolingcavalryV1().Students(ns).Get(ctx, "bad", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("the invalid Student was stored (get: %v)", err)
			}
		})
	}
}

// TestStatusSubresource: status is written only through the status subresource, and
// the status subresource writes nothing else.
func TestStatusSubresource(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	ns := testenv.Namespace(t, c.kube, "test-")
	students := c.student.BolingcavalryV1().Students(ns)

	created, err := students.Create(ctx, &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Name: "wang-wu"},
		Spec:       studentv1.StudentSpec{Name: "王五", School: "深圳中学"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	ready := metav1.Condition{
		Type: studentv1.ConditionReady, Status: metav1.ConditionTrue, Reason: studentv1.ReasonSynced,
		Message: "written", LastTransitionTime: metav1.Now(),
	}

	// An update of the object carries a status; the main resource ignores it.
	withStatus := created.DeepCopy()
	withStatus.Status.ObservedGeneration = 7
	meta.SetStatusCondition(&withStatus.Status.Conditions, ready)
	updated, err := students.Update(ctx, withStatus, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if diff := cmp.Diff(studentv1.StudentStatus{}, updated.Status); diff != "" {
		t.Errorf("update through the main resource changed status (-want +got):\n%s", diff)
	}

	// The status subresource writes the status and ignores a changed spec.
	statusUpdate := updated.DeepCopy()
	statusUpdate.Status.ObservedGeneration = updated.Generation
	meta.SetStatusCondition(&statusUpdate.Status.Conditions, ready)
	statusUpdate.Spec.School = "北京四中"
	if _, err := students.UpdateStatus(ctx, statusUpdate, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status: %v", err)
	}
	got, err := students.Get(ctx, "wang-wu", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.Spec.School != "深圳中学" {
		t.Errorf("status update changed spec.school to %q", got.Spec.School)
	}
	if got.Status.ObservedGeneration != updated.Generation {
		t.Errorf("observedGeneration = %d, want %d", got.Status.ObservedGeneration, updated.Generation)
	}
	if cond := meta.FindStatusCondition(got.Status.Conditions, studentv1.ConditionReady); cond == nil || cond.Status != metav1.ConditionTrue || cond.Reason != studentv1.ReasonSynced {
		t.Errorf("Ready condition = %+v, want True/Synced", cond)
	}
	if got.Generation != created.Generation {
		t.Errorf("a status write bumped generation from %d to %d", created.Generation, got.Generation)
	}
}
