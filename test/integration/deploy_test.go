package integration

import (
	"bufio"
	"bytes"
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2/ktesting"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv"
)

// TestDeployDryRun: the API server accepts everything in config/crd, config/registry (the
// claim and its namespace), config/default, config/postgres and config/samples, with strict field
// validation (kubectl's default): an unknown or
// misspelt field fails it, as the schemas of this release say. (A server-side
// dry run persists nothing, so the namespace it creates must exist for the objects in
// it to be checked: it is created first, as a real first apply would have it.)
func TestDeployDryRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	if err := testenv.EnsureNamespace(ctx, c.kube, "student-controller-system"); err != nil {
		t.Fatal(err)
	}
	out := kubectl(ctx, t, "apply", "--dry-run=server", "-k", filepath.Join(env.Root, "config", "crd"))
	out += kubectl(ctx, t, "apply", "--dry-run=server", "-k", filepath.Join(env.Root, "config", "registry"))
	out += kubectl(ctx, t, "apply", "--dry-run=server", "-k", filepath.Join(env.Root, "config", "default"))
	out += kubectl(ctx, t, "apply", "--dry-run=server", "-k", filepath.Join(env.Root, "config", "postgres"))
	out += kubectl(ctx, t, "apply", "--dry-run=server", "-k", filepath.Join(env.Root, "config", "samples"))
	for _, want := range []string{
		"student.bolingcavalry.k8s.io/ada-lovelace",
		"student.bolingcavalry.k8s.io/li-si",
		"student.bolingcavalry.k8s.io/zhang-san",
		"customresourcedefinition.apiextensions.k8s.io/students.bolingcavalry.k8s.io",
		"mutatingadmissionpolicy.admissionregistration.k8s.io/student-registry-row-finalizer",
		"mutatingadmissionpolicybinding.admissionregistration.k8s.io/student-registry-row-finalizer",
		"deployment.apps/student-controller",
		"clusterrole.rbac.authorization.k8s.io/student-controller",
		"role.rbac.authorization.k8s.io/student-controller-leader-election",
		"serviceaccount/student-controller",
		"persistentvolumeclaim/student-controller-registry",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %s:\n%s", want, out)
		}
	}
}

// TestDeploymentShape: what config/default asks of the cluster: one replica whose SQLite
// registry lives on config/registry's PersistentVolumeClaim (a volume that outlives the
// Pod, and config/default: it holds neither the claim nor its namespace), replaced by
// Recreate, probes, resources and a restricted security context; RBAC limited to what
// the controller uses.
func TestDeploymentShape(t *testing.T) {
	out, err := exec.CommandContext(context.Background(), "kubectl", "kustomize", filepath.Join(env.Root, "config", "default")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	var deploy *appsv1.Deployment
	var clusterRules []rbacv1.PolicyRule
	var roles []rbacv1.Role
	claims := map[string]bool{}
	var namespaces []string
	decoder := yaml.NewYAMLReader(bufioReader(out))
	for {
		doc, err := decoder.Read()
		if err != nil {
			break
		}
		var meta metav1.TypeMeta
		if err := sigsyaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "Deployment":
			deploy = &appsv1.Deployment{}
			if err := sigsyaml.UnmarshalStrict(doc, deploy); err != nil {
				t.Fatal(err)
			}
		case "ClusterRole":
			var r rbacv1.ClusterRole
			if err := sigsyaml.UnmarshalStrict(doc, &r); err != nil {
				t.Fatal(err)
			}
			if r.Name == "student-controller" {
				clusterRules = r.Rules
			}
		case "Role":
			var r rbacv1.Role
			if err := sigsyaml.UnmarshalStrict(doc, &r); err != nil {
				t.Fatal(err)
			}
			roles = append(roles, r)
		case "PersistentVolumeClaim":
			var c corev1.PersistentVolumeClaim
			if err := sigsyaml.UnmarshalStrict(doc, &c); err != nil {
				t.Fatal(err)
			}
			claims[c.Name] = true
		case "Namespace":
			var ns corev1.Namespace
			if err := sigsyaml.UnmarshalStrict(doc, &ns); err != nil {
				t.Fatal(err)
			}
			namespaces = append(namespaces, ns.Name)
		}
	}
	if deploy == nil {
		t.Fatal("config/default has no Deployment")
	}
	// `kubectl delete -k config/default` must leave the registry: its claim, and the
	// namespace whose deletion would take the claim with it.
	if len(claims) > 0 || len(namespaces) > 0 {
		t.Errorf("config/default holds the claims %v and the namespaces %v: deleting it would delete the registry", claims, namespaces)
	}
	registry, err := exec.CommandContext(context.Background(), "kubectl", "kustomize", filepath.Join(env.Root, "config", "registry")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize config/registry: %v", err)
	}
	forEachObject(t, registry, func(kind string, decode func(into any)) {
		if kind == "PersistentVolumeClaim" {
			var c corev1.PersistentVolumeClaim
			decode(&c)
			claims[c.Name] = true
		}
	})
	if deploy.Spec.Replicas == nil || *deploy.Spec.Replicas != 1 || deploy.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("replicas = %v, strategy %q: want 1 and Recreate (a SQLite file has one writer)", deploy.Spec.Replicas, deploy.Spec.Strategy.Type)
	}
	pod := deploy.Spec.Template.Spec
	assertRegistryOnClaim(t, pod, claims)
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod security context %+v: want runAsNonRoot and seccomp RuntimeDefault", pod.SecurityContext)
	}
	ctr := pod.Containers[0]
	sc := ctr.SecurityContext
	if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		t.Errorf("container security context %+v: want no privilege escalation, read-only root, all capabilities dropped", sc)
	}
	if ctr.LivenessProbe == nil || ctr.LivenessProbe.HTTPGet.Path != "/healthz" || ctr.ReadinessProbe == nil || ctr.ReadinessProbe.HTTPGet.Path != "/readyz" {
		t.Error("want a liveness probe on /healthz and a readiness probe on /readyz")
	}
	if ctr.Resources.Requests.Cpu().IsZero() || ctr.Resources.Requests.Memory().IsZero() || ctr.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want CPU and memory requests and a memory limit", ctr.Resources)
	}
	args := strings.Join(ctr.Args, " ")
	for _, want := range []string{"--metrics-secure", "--health-probe-bind-address=:8081"} {
		if !strings.Contains(args, want) {
			t.Errorf("container args %q lack %s", args, want)
		}
	}
	if strings.Contains(args, "--leader-elect") {
		t.Errorf("container args %q: no leader election for one replica on a SQLite file", args)
	}

	// Exactly the rules the controller needs, cluster-wide.
	wantRules := map[string]string{
		"bolingcavalry.k8s.io/students":            "get,list,watch,patch",
		"bolingcavalry.k8s.io/students/status":     "update",
		"bolingcavalry.k8s.io/students/finalizers": "update",
		"/events":                  "create,patch",
		"/namespaces[kube-system]": "get",
		"apiextensions.k8s.io/customresourcedefinitions[students.bolingcavalry.k8s.io]": "get,list,watch",
	}
	got := map[string]string{}
	for _, r := range clusterRules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				key := g + "/" + res
				if len(r.ResourceNames) > 0 {
					key += "[" + strings.Join(r.ResourceNames, ",") + "]"
				}
				got[key] = strings.Join(r.Verbs, ",")
			}
		}
	}
	if len(got) != len(wantRules) {
		t.Errorf("ClusterRole student-controller grants %v, want exactly %v", got, wantRules)
	}
	for k, v := range wantRules {
		if got[k] != v {
			t.Errorf("ClusterRole student-controller: %s = %q, want %q", k, got[k], v)
		}
	}
	// The Lease and the registry's mark: created by any name (RBAC cannot limit create
	// by name), read and renewed only by their own.
	if len(roles) != 1 || roles[0].Namespace != "student-controller-system" || len(roles[0].Rules) != 4 ||
		strings.Join(roles[0].Rules[0].Verbs, ",") != "create" ||
		strings.Join(roles[0].Rules[1].ResourceNames, ",") != "student-controller" || strings.Join(roles[0].Rules[1].Verbs, ",") != "get,update" ||
		strings.Join(roles[0].Rules[2].Resources, ",") != "configmaps" || strings.Join(roles[0].Rules[2].Verbs, ",") != "create" ||
		strings.Join(roles[0].Rules[3].ResourceNames, ",") != "student-controller-registry-mark" || strings.Join(roles[0].Rules[3].Verbs, ",") != "get,update" {
		t.Errorf("want one Role, for the Lease student-controller and the ConfigMap student-controller-registry-mark in student-controller-system; got %+v", roles)
	}
}

// assertRegistryOnClaim checks that --registry names a SQLite file on a volume that is
// one of claims, so that the registry outlives the Pod.
func assertRegistryOnClaim(t *testing.T, pod corev1.PodSpec, claims map[string]bool) {
	t.Helper()
	var file string
	for _, a := range pod.Containers[0].Args {
		if raw, ok := strings.CutPrefix(a, "--registry=sqlite://"); ok {
			file = raw
		}
	}
	if file == "" {
		t.Fatalf("args %q: want a SQLite registry", pod.Containers[0].Args)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, m := range pod.Containers[0].VolumeMounts {
		if !strings.HasPrefix(file, m.MountPath+"/") {
			continue
		}
		v := volumes[m.Name]
		if v.PersistentVolumeClaim == nil || !claims[v.PersistentVolumeClaim.ClaimName] {
			t.Errorf("the registry %s is on volume %+v: want a PersistentVolumeClaim that the manifests make", file, v.VolumeSource)
		}
		return
	}
	t.Errorf("the registry %s is on no volume: the container's own filesystem goes with it", file)
}

// TestPostgresOverlay: config/postgres swaps the SQLite registry for PostgreSQL, with
// the password from a mounted Secret rather than the command line.
func TestPostgresOverlay(t *testing.T) {
	out, err := exec.CommandContext(context.Background(), "kubectl", "kustomize", filepath.Join(env.Root, "config", "postgres")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	decoder := yaml.NewYAMLReader(bufioReader(out))
	for {
		doc, err := decoder.Read()
		if err != nil {
			t.Fatal("config/postgres has no Deployment")
		}
		var d appsv1.Deployment
		if err := sigsyaml.Unmarshal(doc, &d); err != nil || d.Kind != "Deployment" {
			continue
		}
		ctr := d.Spec.Template.Spec.Containers[0]
		args := strings.Join(ctr.Args, " ")
		if !strings.Contains(args, "--registry-password-file=/etc/student-registry/password") || strings.Contains(args, "sqlite") {
			t.Errorf("args %q: want a password file and no SQLite", args)
		}
		for _, a := range ctr.Args {
			if raw, ok := strings.CutPrefix(a, "--registry="); ok {
				u, err := url.Parse(raw)
				if err != nil || u.Scheme != "postgres" {
					t.Errorf("--registry=%s: want a postgres URL (%v)", raw, err)
				} else if _, hasPassword := u.User.Password(); hasPassword {
					t.Errorf("--registry=%s carries a password", u.Redacted())
				}
			}
		}
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 || !strings.Contains(args, "--leader-elect") {
			t.Errorf("replicas %v, args %q: want 2 with leader election on a shared registry", d.Spec.Replicas, args)
		}
		var secret *corev1.SecretVolumeSource
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName == "student-registry" {
				secret = v.Secret
			}
		}
		if secret == nil {
			t.Fatal("the Secret student-registry is not mounted")
		}
		assertReadableAsPod(t, d.Spec.Template.Spec, secret)
		return
	}
}

// assertReadableAsPod writes a file as the kubelet writes a Secret's key (owned by
// root, with the volume's mode; with an fsGroup, its group that and group read added,
// as the kubelet's SetVolumeOwnership does), and reads it as the Pod's user and groups,
// in a process the kernel checks.
func assertReadableAsPod(t *testing.T, pod corev1.PodSpec, secret *corev1.SecretVolumeSource) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root, to make a file another user reads (CI runs as root)")
	}
	psc := pod.SecurityContext
	if psc == nil || psc.RunAsUser == nil {
		t.Fatal("the Pod names no user")
	}
	mode := os.FileMode(0o644) // the kubelet's default
	if secret.DefaultMode != nil {
		mode = os.FileMode(*secret.DefaultMode)
	}
	gid := 0
	groups := []uint32{}
	if psc.RunAsGroup != nil {
		groups = append(groups, uint32(*psc.RunAsGroup))
	}
	if psc.FSGroup != nil {
		gid = int(*psc.FSGroup)
		groups = append(groups, uint32(*psc.FSGroup))
		mode |= 0o440
	}
	dir, err := os.MkdirTemp("", "secret-volume-") // t.TempDir's parent is closed to other users
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "password")
	if err := os.WriteFile(file, []byte("s3cret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(file, 0, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(file, mode); err != nil {
		t.Fatal(err)
	}
	cat := exec.Command("cat", file)
	primary := uint32(0)
	if psc.RunAsGroup != nil {
		primary = uint32(*psc.RunAsGroup)
	}
	cat.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(*psc.RunAsUser), Gid: primary, Groups: groups}}
	if out, err := cat.CombinedOutput(); err != nil || string(out) != "s3cret" {
		t.Errorf("user %d (groups %v) reading the password file (mode %v, group %d): %v, %q", *psc.RunAsUser, groups, mode, gid, err, out)
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
