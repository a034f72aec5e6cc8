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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
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

// TestChartMatchesKustomize: with its default values the chart renders what a
// kustomize install applies (config/registry, the claim and its namespace, then
// config/default), object for object, but for what differs by design: the chart
// leaves the Namespace to `helm install --create-namespace`, labels its objects (and so
// selects its Pods) with the release too, and names an image tag where the kustomize
// manifests have a placeholder to set.
func TestChartMatchesKustomize(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	chart := substance(t, helm(ctx, t, "template", chartRelease, chartDir, "--namespace", chartNS, "--include-crds", "--kube-version", kubeVersion))
	kustomize := map[string]map[string]any{}
	for _, dir := range []string{"crd", "registry", "default"} {
		kustomized, err := exec.CommandContext(ctx, "kubectl", "kustomize", filepath.Join(env.Root, "config", dir)).Output()
		if err != nil {
			t.Fatalf("kubectl kustomize config/%s: %v", dir, err)
		}
		for key, obj := range substance(t, string(kustomized)) {
			if _, twice := kustomize[key]; twice {
				t.Errorf("%s is in two of config/crd, config/registry and config/default: deleting config/default would delete it", key)
			}
			kustomize[key] = obj
		}
	}
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
// the release's objects and takes the CRD that was there (--take-ownership, as an
// upgrade from a chart that kept it in crds/ does), and `helm uninstall` removes them
// but keeps the CRD (helm.sh/resource-policy: keep). (The control plane has no
// kubelet: the Pods never run.)
func TestChartInstallUninstall(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	const release, ns = "student-controller-it", "student-controller-helm-it"
	// The test control plane already has the admission policy, outside any release.
	helm(ctx, t, "install", release, chartDir, "--namespace", ns, "--create-namespace", "--take-ownership",
		"--set", "admissionPolicy.enabled=false", "--set", "registry.owner=helm-it")
	crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	if crd, err := c.dynamic.Resource(crds).Get(ctx, "students.bolingcavalry.k8s.io", metav1.GetOptions{}); err != nil ||
		crd.GetAnnotations()["meta.helm.sh/release-name"] != release {
		t.Errorf("the CRD after helm install: %v, annotations %v; want it the release's", err, crd.GetAnnotations())
	}
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

// TestChartPostgresTLS: registry.tls mounts the CA (from a Secret or a ConfigMap) and
// the client certificate, readable by the Pod, and names them in the URL, whether it
// has a query or not.
func TestChartPostgresTLS(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	const ca, client = "sslrootcert=/etc/student-registry-tls/ca/ca.crt", "sslcert=/etc/student-registry-tls/client/tls.crt&sslkey=/etc/student-registry-tls/client/tls.key"
	var pods []corev1.PodSpec
	for _, tc := range []struct{ kind, url, want string }{
		{"caSecret", "postgres://student_controller@db:5432/students?sslmode=verify-full", "postgres://student_controller@db:5432/students?sslmode=verify-full&" + ca + "&" + client},
		{"caConfigMap", "postgres://student_controller@db:5432/students", "postgres://student_controller@db:5432/students?" + ca + "&" + client},
	} {
		r := shapeOf(t, helmTemplate(ctx, t, chartRelease, nil, "registry.url="+tc.url,
			"registry.tls."+tc.kind+"=pg-ca", "registry.tls.caKey=bundle.pem", "registry.tls.clientSecret=pg-client"))
		if got := r.flags["registry"]; got != tc.want {
			t.Errorf("%s: --registry=%s; want %s", tc.kind, got, tc.want)
		}
		mounts := map[string]string{}
		for _, m := range r.pod.Containers[0].VolumeMounts {
			mounts[m.Name] = m.MountPath
		}
		if mounts["registry-ca"] != "/etc/student-registry-tls/ca" || mounts["registry-client-cert"] != "/etc/student-registry-tls/client" {
			t.Errorf("%s: mounts %v; want the CA and the client certificate", tc.kind, mounts)
		}
		volumes := map[string]corev1.VolumeSource{}
		for _, v := range r.pod.Volumes {
			volumes[v.Name] = v.VolumeSource
		}
		caVolume, clientVolume := volumes["registry-ca"], volumes["registry-client-cert"]
		switch {
		case tc.kind == "caSecret" && (caVolume.Secret == nil || caVolume.Secret.SecretName != "pg-ca" || caVolume.Secret.Items[0].Key != "bundle.pem"),
			tc.kind == "caConfigMap" && (caVolume.ConfigMap == nil || caVolume.ConfigMap.Name != "pg-ca" || caVolume.ConfigMap.Items[0].Key != "bundle.pem"):
			t.Errorf("%s: the CA's volume %+v", tc.kind, caVolume)
		}
		if clientVolume.Secret == nil || clientVolume.Secret.SecretName != "pg-client" {
			t.Fatalf("%s: the client certificate's volume %+v", tc.kind, clientVolume)
		}
		pods = append(pods, r.pod)
	}
	for _, pod := range pods { // last: it skips unless root
		for _, v := range pod.Volumes {
			if v.Name == "registry-client-cert" {
				assertReadableAsPod(t, pod, v.Secret)
			}
		}
	}
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

// helmTemplate renders the chart as release in chartNS with --set values and more
// arguments for helm (--is-upgrade) first.
func helmTemplate(ctx context.Context, t *testing.T, release string, more []string, set ...string) []byte {
	t.Helper()
	args := append([]string{"template", release, chartDir, "--namespace", chartNS, "--kube-version", kubeVersion}, more...)
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return []byte(helm(ctx, t, args...))
}

// releaseShape is what a render says about a release's Lease and owner: the
// controller's flags, the Lease names its Role lets it read and renew, and the
// ConfigMap names (the registry's mark).
type releaseShape struct {
	flags     map[string]string
	leaseRole []string
	markRole  []string
	pod       corev1.PodSpec
}

func shapeOf(t *testing.T, out []byte) releaseShape {
	t.Helper()
	r := releaseShape{flags: map[string]string{}}
	forEachObject(t, out, func(kind string, decode func(into any)) {
		switch kind {
		case "Deployment":
			var d appsv1.Deployment
			decode(&d)
			r.pod = d.Spec.Template.Spec
			for _, arg := range d.Spec.Template.Spec.Containers[0].Args {
				name, value, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
				r.flags[name] = value
			}
		case "Role":
			var role rbacv1.Role
			decode(&role)
			for _, rule := range role.Rules {
				switch {
				case !slices.Contains(rule.Verbs, "update"):
				case slices.Contains(rule.Resources, "leases"):
					r.leaseRole = append(r.leaseRole, rule.ResourceNames...)
				case slices.Contains(rule.Resources, "configmaps"):
					r.markRole = append(r.markRole, rule.ResourceNames...)
				}
			}
		}
	})
	return r
}

// TestChartReleasesApart: two releases in one namespace have a Lease each (the
// controller's --leader-elect-id and the name its Role lets it renew), named after the
// release, and the owner each gives; the release named student-controller renders as
// before, with the controller's default owner and no owner flag (config/default has
// none).
func TestChartReleasesApart(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	postgres := []string{"replicaCount=2", "leaderElection.enabled=true",
		"registry.url=postgres://student_controller@db/students", "registry.passwordSecret.name=student-registry"}
	tests := map[string]struct {
		release string
		set     []string
		lease   string
		owner   string // "" for no --registry-owner flag
	}{
		"the default release": {release: chartRelease, set: postgres, lease: "student-controller"},
		"team-a": {release: "team-a", set: append([]string{"registry.owner=team-a"}, postgres...),
			lease: "team-a-student-controller", owner: "team-a"},
		"team-b": {release: "team-b", set: append([]string{"registry.owner=team-b"}, postgres...),
			lease: "team-b-student-controller", owner: "team-b"},
		"a name holding the chart's": {release: "student-controller-blue", set: append([]string{"registry.owner=blue"}, postgres...),
			lease: "student-controller-blue", owner: "blue"},
		"an owner given": {release: "team-c", set: append([]string{"registry.owner=registry-c"}, postgres...),
			lease: "team-c-student-controller", owner: "registry-c"},
	}
	leases, owners := map[string]string{}, map[string]string{}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			r := shapeOf(t, helmTemplate(ctx, t, tc.release, nil, tc.set...))
			if _, on := r.flags["leader-elect"]; !on || r.flags["leader-elect-id"] != tc.lease {
				t.Errorf("flags %v: want --leader-elect --leader-elect-id=%s", r.flags, tc.lease)
			}
			if diff := cmp.Diff([]string{tc.lease}, r.leaseRole); diff != "" {
				t.Errorf("the Lease the Role lets the controller renew (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{tc.lease + "-registry-mark"}, r.markRole); diff != "" {
				t.Errorf("the registry's mark the Role lets the controller keep (-want +got):\n%s", diff)
			}
			owner, given := r.flags["registry-owner"]
			if tc.owner == "" && given || tc.owner != "" && owner != tc.owner {
				t.Errorf("--registry-owner=%q (given: %v), want %q (\"\" for none: the controller's default)", owner, given, tc.owner)
			}
			leases[name], owners[name] = r.flags["leader-elect-id"], owner
		})
	}
	if leases["team-a"] == leases["team-b"] || owners["team-a"] == owners["team-b"] {
		t.Errorf("two releases in one namespace share a Lease or an owner: Leases %v, owners %v", leases, owners)
	}

	// Without leader election the Lease's name still names the registry's mark, and
	// the Role still names the release's Lease.
	r := shapeOf(t, helmTemplate(ctx, t, "team-a", nil, "registry.owner=team-a"))
	if id := r.flags["leader-elect-id"]; id != "team-a-student-controller" {
		t.Errorf("--leader-elect-id=%q without leader election, want team-a-student-controller (the mark's name)", id)
	}
	if diff := cmp.Diff([]string{"team-a-student-controller"}, r.leaseRole); diff != "" {
		t.Errorf("the Lease the Role names without leader election (-want +got):\n%s", diff)
	}
	if got := r.flags["registry-owner"]; got != "team-a" {
		t.Errorf("a fresh install of team-a: --registry-owner=%q, want team-a", got)
	}

	// An upgrade with the owner given renders; so does one of the release named
	// student-controller, whose owner does not change.
	r = shapeOf(t, helmTemplate(ctx, t, "team-a", []string{"--is-upgrade"}, "registry.owner=student-controller"))
	if got := r.flags["registry-owner"]; got != "student-controller" {
		t.Errorf("an upgrade of team-a keeping the old owner: --registry-owner=%q, want student-controller", got)
	}
	r = shapeOf(t, helmTemplate(ctx, t, chartRelease, []string{"--is-upgrade"}))
	if owner, given := r.flags["registry-owner"]; given {
		t.Errorf("an upgrade of %s: --registry-owner=%s, want none", chartRelease, owner)
	}
}

// TestChartRefuses: values that would install something broken or unsafe fail to
// render, and the message says what to do instead (and shows no password).
func TestChartRefuses(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	shared := []string{"leaderElection.enabled=true", "replicaCount=2", "registry.sqliteSharedFile=true"}
	tests := map[string]struct {
		release string
		more    []string
		set     []string
		want    string
	}{
		"sqliteSharedFile without leader election": {
			set:  []string{"registry.sqliteSharedFile=true"},
			want: "registry.sqliteSharedFile without leaderElection.enabled",
		},
		"sqliteSharedFile with PostgreSQL": {
			set:  []string{"registry.sqliteSharedFile=true", "registry.url=postgres://student_controller@db/students"},
			want: "registry.sqliteSharedFile with a registry that is not SQLite",
		},
		"affinity over sqliteSharedFile's": {
			set:  append([]string{"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=zone"}, shared...),
			want: "affinity with registry.sqliteSharedFile",
		},
		"a spread over nodes with sqliteSharedFile": {
			set:  append([]string{"topologySpreadConstraints[0].topologyKey=kubernetes.io/hostname", "topologySpreadConstraints[0].maxSkew=1"}, shared...),
			want: "topologySpreadConstraints with registry.sqliteSharedFile",
		},
		"a password in the URL": {
			set:  []string{"registry.url=postgres://student_controller:s3cret@db/students"},
			want: "registry.passwordSecret.name",
		},
		"a password in the URL, the parameter in capitals": {
			set:  []string{"registry.url=postgres://student_controller@db/students?PASSWORD=s3cret"},
			want: "registry.passwordSecret.name",
		},
		"sqliteSharedFile without persistence": {
			set:  append([]string{"registry.persistence.enabled=false"}, shared...),
			want: "registry.sqliteSharedFile without registry.persistence.enabled",
		},
		"a password in the URL's query": {
			set:  []string{"registry.url=postgres://student_controller@db/students?sslmode=verify-full&password=s3cret"},
			want: "registry.passwordSecret.name",
		},
		"a release not named student-controller without an owner": {
			release: "team-a",
			want:    "registry.owner is empty, and the release team-a is not named student-controller",
		},
		"the same, as an upgrade": {
			release: "team-a",
			more:    []string{"--is-upgrade"},
			want:    "registry.owner=student-controller",
		},
		"a Lease name in extraArgs": {
			set:  []string{"leaderElection.enabled=true", "registry.url=postgres://student_controller@db/students", "extraArgs={--leader-elect-id=other}"},
			want: "--leader-elect-id in extraArgs",
		},
		"an owner in extraArgs": {
			set:  []string{"extraArgs={--registry-owner=other}"},
			want: "set registry.owner rather than --registry-owner in extraArgs",
		},
		"a CA for SQLite": {
			set:  []string{"registry.tls.caSecret=pg-ca"},
			want: "registry.tls with a SQLite registry",
		},
		"a CA twice": {
			set:  []string{"registry.url=postgres://student_controller@db/students", "registry.tls.caSecret=pg-ca", "registry.tls.caConfigMap=pg-ca"},
			want: "name the CA in one of them",
		},
		"a CA and an sslrootcert": {
			set:  []string{"registry.url=postgres://student_controller@db/students?sslrootcert=/x", "registry.tls.caConfigMap=pg-ca"},
			want: "leave sslrootcert out of the URL",
		},
		"a CA with sslmode=prefer": {
			set:  []string{"registry.url=postgres://student_controller@db/students?sslmode=prefer", "registry.tls.caConfigMap=pg-ca"},
			want: "sslmode=disable, allow or prefer",
		},
	}
	bin := filepath.Join(env.Root, "bin", "tools", "helm")
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			release := tc.release
			if release == "" {
				release = chartRelease
			}
			args := append([]string{"template", release, chartDir, "--namespace", chartNS, "--kube-version", kubeVersion}, tc.more...)
			for _, s := range tc.set {
				args = append(args, "--set", s)
			}
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Dir = env.Root
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("helm %s: %v, %s; want a refusal saying %q", strings.Join(args, " "), err, out, tc.want)
			}
			if strings.Contains(string(out), "s3cret") {
				t.Errorf("the refusal shows the password:\n%s", out)
			}
		})
	}
}

// TestChartSharedSQLiteFile: replicas on one SQLite file run on one node: a required
// affinity to the release's own Pods on kubernetes.io/hostname (which the first Pod
// meets by matching itself), and no spreading.
func TestChartSharedSQLiteFile(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	r := shapeOf(t, helmTemplate(ctx, t, "team-a", nil, "registry.owner=team-a", "leaderElection.enabled=true", "replicaCount=2", "registry.sqliteSharedFile=true"))
	for _, flag := range []string{"leader-elect", "sqlite-shared-file"} {
		if _, on := r.flags[flag]; !on {
			t.Errorf("flags %v lack --%s", r.flags, flag)
		}
	}
	a := r.pod.Affinity
	if a == nil || a.PodAffinity == nil {
		t.Fatalf("affinity %+v: want a required podAffinity", a)
	}
	want := []corev1.PodAffinityTerm{{
		TopologyKey: "kubernetes.io/hostname",
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{
			"app.kubernetes.io/name": "student-controller", "app.kubernetes.io/instance": "team-a"}},
	}}
	if diff := cmp.Diff(want, a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution); diff != "" {
		t.Errorf("the required podAffinity (-want +got):\n%s", diff)
	}
	if a.PodAntiAffinity != nil || a.NodeAffinity != nil || len(r.pod.TopologySpreadConstraints) > 0 {
		t.Errorf("affinity %+v, spread %+v: want nothing that spreads the replicas over nodes", a, r.pod.TopologySpreadConstraints)
	}
}
