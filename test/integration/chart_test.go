package integration

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2/ktesting"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv"
)

const (
	chartDir     = "charts/student-controller"
	kubeVersion  = "1.37.2"
	chartNS      = "student-controller-system"
	chartRelease = "student-controller"
)

// helm runs the Helm CLI that hack/tools/helm pins, against the test control plane.
func helm(ctx context.Context, t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(env.Root, "bin", "tools", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("bin/tools/helm is missing: `make helm` builds it, as make test does (%v)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append(args, "--kubeconfig", env.Kubeconfig)...)
	cmd.Dir = env.Root
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// TestChartLint: `helm lint --strict` passes.
func TestChartLint(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	out := helm(ctx, t, "lint", "--strict", "--kube-version", kubeVersion, chartDir)
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Errorf("helm lint:\n%s", out)
	}
}

// TestChartMatchesKustomize: with its default values the chart renders what
// config/default renders, object for object, but for what differs by design: the
// chart leaves the Namespace to `helm install --create-namespace`, labels its objects
// (and so selects its Pods) with the release too, and names an image tag where the
// kustomize manifests have a placeholder to set.
func TestChartMatchesKustomize(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	chart := substance(t, helm(ctx, t, "template", chartRelease, chartDir, "--namespace", chartNS, "--include-crds", "--kube-version", kubeVersion))
	kustomized, err := exec.CommandContext(ctx, "kubectl", "kustomize", filepath.Join(env.Root, "config", "default")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/default: %v", err)
	}
	kustomize := substance(t, string(kustomized))
	delete(kustomize, "Namespace/"+chartNS)
	if len(chart) < 10 {
		t.Fatalf("the chart renders %d objects; expected the whole controller", len(chart))
	}
	if diff := cmp.Diff(kustomize, chart); diff != "" {
		t.Errorf("the chart and config/default differ in substance (-kustomize +chart):\n%s", diff)
	}
}

// substance parses rendered manifests into objects by kind/name, without what the
// chart and kustomize differ in by design.
func substance(t *testing.T, manifests string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	docs := yaml.NewYAMLReader(bufio.NewReader(strings.NewReader(manifests)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		obj := map[string]any{}
		if err := yaml.Unmarshal(doc, &obj); err != nil {
			t.Fatal(err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		u.SetLabels(nil)
		u.SetAnnotations(nil)
		for _, path := range [][]string{
			{"spec", "selector"},                       // Deployment, Service, PodDisruptionBudget
			{"spec", "podSelector"},                    // NetworkPolicy
			{"spec", "template", "metadata", "labels"}, // Deployment
			{"spec", "template", "spec", "affinity", "podAntiAffinity"},
		} {
			unstructured.RemoveNestedField(u.Object, path...)
		}
		if u.GetKind() == "Deployment" {
			containers, _, _ := unstructured.NestedSlice(u.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				delete(c.(map[string]any), "image")
				delete(c.(map[string]any), "imagePullPolicy")
			}
			_ = unstructured.SetNestedSlice(u.Object, containers, "spec", "template", "spec", "containers")
		}
		out[u.GetKind()+"/"+u.GetName()] = u.Object
	}
	return out
}

// TestChartDryRunServer: the API server accepts everything the chart renders.
func TestChartDryRunServer(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	if err := testenv.EnsureNamespace(ctx, c.kube, chartNS); err != nil {
		t.Fatal(err)
	}
	rendered := helm(ctx, t, "template", chartRelease, chartDir, "--namespace", chartNS, "--include-crds", "--kube-version", kubeVersion)
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", env.Kubeconfig, "apply", "--dry-run=server", "-f", "-")
	cmd.Stdin = strings.NewReader(rendered)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl apply --dry-run=server of the chart: %v\n%s", err, out)
	}
	for _, want := range []string{"deployment.apps/student-controller", "clusterrole.rbac.authorization.k8s.io/student-controller",
		"networkpolicy.networking.k8s.io/student-controller", "poddisruptionbudget.policy/student-controller"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("dry run output lacks %s:\n%s", want, out)
		}
	}
}

// TestChartInstallUninstall: a real `helm install` on the local control plane creates
// the release's objects, and `helm uninstall` removes them and keeps the CRD, as Helm
// keeps the CRDs of crds/. (The control plane has no kubelet: the Pods never run.)
func TestChartInstallUninstall(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	const release, ns = "student-controller-it", "student-controller-helm-it"
	// The test control plane already has the admission policy, outside any release.
	helm(ctx, t, "install", release, chartDir, "--namespace", ns, "--create-namespace",
		"--set", "admissionPolicy.enabled=false", "--set", "registry.owner=helm-it")
	deployment := schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}
	clusterRole := schema.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterroles"}
	if _, err := c.dynamic.Resource(deployment).Namespace(ns).Get(ctx, release, metav1.GetOptions{}); err != nil {
		t.Fatalf("after helm install: %v", err)
	}
	d, _ := c.kube.AppsV1().Deployments(ns).Get(ctx, release, metav1.GetOptions{})
	if args := strings.Join(d.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--registry-owner=helm-it") {
		t.Errorf("the release's args %q lack the owner it was given", args)
	}

	helm(ctx, t, "uninstall", release, "--namespace", ns, "--wait", "--timeout", "1m")
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, errD := c.dynamic.Resource(deployment).Namespace(ns).Get(ctx, release, metav1.GetOptions{})
		_, errR := c.dynamic.Resource(clusterRole).Get(ctx, release, metav1.GetOptions{})
		return apierrors.IsNotFound(errD) && apierrors.IsNotFound(errR), nil
	})
	if err != nil {
		t.Errorf("helm uninstall left the release's Deployment or ClusterRole: %v", err)
	}
	if _, err := c.kube.Discovery().ServerResourcesForGroupVersion("bolingcavalry.k8s.io/v1"); err != nil {
		t.Errorf("the CRD went with the release: %v", err)
	}
	_ = c.kube.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
}

// TestChartKeepsTheRegistry: the chart keeps one registry that outlives its Pods: with
// SQLite, one replica and a claim, and it refuses to render a file per replica; with
// PostgreSQL, the password Secret is readable by the user the controller runs as.
func TestChartKeepsTheRegistry(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	template := func(set ...string) []byte {
		args := []string{"template", chartRelease, chartDir, "--namespace", chartNS, "--kube-version", kubeVersion}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		return []byte(helm(ctx, t, args...))
	}
	deployment := func(out []byte) (appsv1.Deployment, map[string]bool) {
		var d appsv1.Deployment
		claims := map[string]bool{}
		forEachObject(t, out, func(kind string, decode func(into any)) {
			switch kind {
			case "Deployment":
				decode(&d)
			case "PersistentVolumeClaim":
				var c corev1.PersistentVolumeClaim
				decode(&c)
				claims[c.Name] = true
			}
		})
		return d, claims
	}

	d, claims := deployment(template())
	if *d.Spec.Replicas != 1 || d.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("defaults: replicas %d, strategy %q; want 1 and Recreate", *d.Spec.Replicas, d.Spec.Strategy.Type)
	}
	assertRegistryOnClaim(t, d.Spec.Template.Spec, claims)

	bin := filepath.Join(env.Root, "bin", "tools", "helm")
	for _, set := range [][]string{
		{"replicaCount=2", "leaderElection.enabled=true"},
		{"leaderElection.enabled=true"},
	} {
		args := []string{"template", chartRelease, chartDir, "--namespace", chartNS, "--kube-version", kubeVersion}
		for _, s := range set {
			args = append(args, "--set", s)
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Dir = env.Root
		if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "registry would split") {
			t.Errorf("helm template --set %v with SQLite: %v, %s; want a refusal", set, err, out)
		}
	}

	d, _ = deployment(template("replicaCount=2", "leaderElection.enabled=true",
		"registry.url=postgres://student_controller@db/students", "registry.passwordSecret.name=student-registry"))
	var secret *corev1.SecretVolumeSource
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Secret != nil {
			secret = v.Secret
		}
	}
	if secret == nil {
		t.Fatal("PostgreSQL: no password Secret mounted")
	}
	assertReadableAsPod(t, d.Spec.Template.Spec, secret)
}

// forEachObject calls fn with the kind of each object of a rendered chart and a
// function that decodes it (failing the test when it cannot).
func forEachObject(t *testing.T, out []byte, fn func(kind string, decode func(into any))) {
	t.Helper()
	docs := yaml.NewYAMLReader(bufioReader(out))
	for {
		doc, err := docs.Read()
		if err != nil {
			return
		}
		var meta metav1.TypeMeta
		_ = sigsyaml.Unmarshal(doc, &meta)
		fn(meta.Kind, func(into any) {
			if err := sigsyaml.Unmarshal(doc, into); err != nil {
				t.Fatalf("%s: %v", meta.Kind, err)
			}
		})
	}
}
