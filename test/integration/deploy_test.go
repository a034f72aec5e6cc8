package integration

import (
	"bufio"
	"bytes"
	"context"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/klog/v2/ktesting"
	sigsyaml "sigs.k8s.io/yaml"
)

// TestDeployDryRun: the API server accepts everything in config/default. (A server-side
// dry run persists nothing, so the namespace it creates must exist for the objects in
// it to be checked: it is created first, as a real first apply would have it.)
func TestDeployDryRun(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	c := newClients(t)
	ensureNamespace(ctx, t, c, "student-controller-system")
	out := kubectl(ctx, t, "apply", "--dry-run=server", "-k", filepath.Join(env.Root, "config", "default"))
	out += kubectl(ctx, t, "apply", "--dry-run=server", "-k", filepath.Join(env.Root, "config", "postgres"))
	for _, want := range []string{
		"customresourcedefinition.apiextensions.k8s.io/students.bolingcavalry.k8s.io",
		"mutatingadmissionpolicy.admissionregistration.k8s.io/student-registry-row-finalizer",
		"mutatingadmissionpolicybinding.admissionregistration.k8s.io/student-registry-row-finalizer",
		"deployment.apps/student-controller",
		"clusterrole.rbac.authorization.k8s.io/student-controller",
		"role.rbac.authorization.k8s.io/student-controller-leader-election",
		"serviceaccount/student-controller",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dry run output lacks %s:\n%s", want, out)
		}
	}
}

// TestDeploymentShape: what config/default asks of the cluster: two replicas with leader
// election, probes, resources and a restricted security context; RBAC limited to what
// the controller uses.
func TestDeploymentShape(t *testing.T) {
	out, err := exec.CommandContext(context.Background(), "kubectl", "kustomize", filepath.Join(env.Root, "config", "default")).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize: %v", err)
	}
	var deploy *appsv1.Deployment
	var clusterRules []rbacv1.PolicyRule
	var roles []rbacv1.Role
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
		}
	}
	if deploy == nil {
		t.Fatal("config/default has no Deployment")
	}
	if deploy.Spec.Replicas == nil || *deploy.Spec.Replicas != 2 {
		t.Errorf("replicas = %v, want 2", deploy.Spec.Replicas)
	}
	pod := deploy.Spec.Template.Spec
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
	for _, want := range []string{"--leader-elect", "--metrics-secure", "--health-probe-bind-address=:8081"} {
		if !strings.Contains(args, want) {
			t.Errorf("container args %q lack %s", args, want)
		}
	}

	// Exactly the rules the controller needs, cluster-wide.
	wantRules := map[string]string{
		"bolingcavalry.k8s.io/students":            "get,list,watch,update,patch",
		"bolingcavalry.k8s.io/students/status":     "get,update,patch",
		"bolingcavalry.k8s.io/students/finalizers": "update",
		"/events": "create,patch",
	}
	got := map[string]string{}
	for _, r := range clusterRules {
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				got[g+"/"+res] = strings.Join(r.Verbs, ",")
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
	if len(roles) != 1 || roles[0].Namespace != "student-controller-system" || len(roles[0].Rules) != 1 ||
		roles[0].Rules[0].Resources[0] != "leases" {
		t.Errorf("want one Role, for leases in student-controller-system; got %+v", roles)
	}
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
		mounted := false
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Secret != nil && v.Secret.SecretName == "student-registry" {
				mounted = true
			}
		}
		if !mounted {
			t.Error("the Secret student-registry is not mounted")
		}
		return
	}
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
