package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"

	studentv1 "github.com/student-controller/student-controller/pkg/apis/bolingcavalry/v1"
	"github.com/student-controller/student-controller/pkg/generated/clientset/versioned"
)

// InstallAdmissionPolicy creates or updates the MutatingAdmissionPolicy and its binding
// from config/admission/policy.yaml, and waits until the API server applies them. For
// a few seconds after a CRD or a policy is installed, creates that the policy matches
// fail (503, "Resource kind ... not found") or pass unmutated, whatever the
// failurePolicy; so it waits until a server-side dry-run create of a Student comes back
// with the finalizer.
func (e *Env) InstallAdmissionPolicy(ctx context.Context) error {
	policy, binding, err := readAdmissionPolicy(filepath.Join(e.Root, "config", "admission", "policy.yaml"))
	if err != nil {
		return err
	}
	client := kubernetes.NewForConfigOrDie(e.Config).AdmissionregistrationV1()
	if err := createOrUpdate(ctx, client.MutatingAdmissionPolicies(), policy); err != nil {
		return fmt.Errorf("install MutatingAdmissionPolicy %s: %w", policy.Name, err)
	}
	if err := createOrUpdate(ctx, client.MutatingAdmissionPolicyBindings(), binding); err != nil {
		return fmt.Errorf("install MutatingAdmissionPolicyBinding %s: %w", binding.Name, err)
	}
	return waitForFinalizerOnCreate(ctx, e.Config, true)
}

// objects is what createOrUpdate needs of a typed client.
type objects[T metav1.Object] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error)
	Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error)
	Update(ctx context.Context, obj T, opts metav1.UpdateOptions) (T, error)
}

// createOrUpdate creates obj, or replaces the object of its name (a control plane
// whose etcd data outlives a run, as make run's does, already has it).
func createOrUpdate[T metav1.Object](ctx context.Context, client objects[T], obj T) error {
	old, err := client.Get(ctx, obj.GetName(), metav1.GetOptions{})
	switch {
	case err == nil:
		obj.SetResourceVersion(old.GetResourceVersion())
		_, err = client.Update(ctx, obj, metav1.UpdateOptions{})
	case apierrors.IsNotFound(err):
		_, err = client.Create(ctx, obj, metav1.CreateOptions{})
	}
	return err
}

// RemoveAdmissionPolicy deletes the binding and the policy, and waits until a new
// Student no longer gets the finalizer from the API server.
func (e *Env) RemoveAdmissionPolicy(ctx context.Context) error {
	policy, binding, err := readAdmissionPolicy(filepath.Join(e.Root, "config", "admission", "policy.yaml"))
	if err != nil {
		return err
	}
	client := kubernetes.NewForConfigOrDie(e.Config).AdmissionregistrationV1()
	if err := client.MutatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete MutatingAdmissionPolicyBinding %s: %w", binding.Name, err)
	}
	if err := client.MutatingAdmissionPolicies().Delete(ctx, policy.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete MutatingAdmissionPolicy %s: %w", policy.Name, err)
	}
	return waitForFinalizerOnCreate(ctx, e.Config, false)
}

// waitForFinalizerOnCreate polls server-side dry-run creates of a Student until they
// come back with the controller's finalizer (want) or without it (!want).
func waitForFinalizerOnCreate(ctx context.Context, cfg *rest.Config, want bool) error {
	students := versioned.NewForConfigOrDie(cfg).BolingcavalryV1().Students(metav1.NamespaceDefault)
	probe := &studentv1.Student{
		ObjectMeta: metav1.ObjectMeta{Name: "admission-policy-probe"},
		Spec:       studentv1.StudentSpec{Name: "probe", School: "probe"},
	}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		created, err := students.Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err
			return false, nil
		}
		last = nil
		return slices.Contains(created.Finalizers, studentv1.FinalizerRegistryRow) == want, nil
	})
	if err != nil {
		state := "added"
		if !want {
			state = "no longer added"
		}
		return errors.Join(fmt.Errorf("the admission policy's finalizer was not %s to new Students within a minute: %w", state, err), last)
	}
	return nil
}

// readAdmissionPolicy reads the policy and its binding from a multi-document YAML file.
func readAdmissionPolicy(path string) (*admissionv1.MutatingAdmissionPolicy, *admissionv1.MutatingAdmissionPolicyBinding, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var policy *admissionv1.MutatingAdmissionPolicy
	var binding *admissionv1.MutatingAdmissionPolicyBinding
	docs := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", path, err)
		}
		switch o := obj.(type) {
		case *admissionv1.MutatingAdmissionPolicy:
			policy = o
		case *admissionv1.MutatingAdmissionPolicyBinding:
			binding = o
		default:
			return nil, nil, fmt.Errorf("%s: unexpected %T", path, obj)
		}
	}
	if policy == nil || binding == nil {
		return nil, nil, fmt.Errorf("%s: want a MutatingAdmissionPolicy and its binding", path)
	}
	return policy, binding, nil
}
