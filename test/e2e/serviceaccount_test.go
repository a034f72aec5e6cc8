package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv/controlplane"
)

// The controller's identity in a cluster, from config/rbac.
const (
	systemNamespace = controlplane.ControllerNamespace
	serviceAccount  = controlplane.ControllerServiceAccount
)

// leaseRBAC gives the controller's ServiceAccount config/rbac's leader election Role in
// namespace ns too, as shipped but for the namespace, so that a test's replicas elect
// their leader on a Lease of their own (the Role lets them use only the Lease named
// student-controller).
func leaseRBAC(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	var role rbacv1.Role
	var binding rbacv1.RoleBinding
	for file, obj := range map[string]any{"leader_election_role.yaml": &role, "leader_election_role_binding.yaml": &binding} {
		b, err := os.ReadFile(filepath.Join(env.Root, "config", "rbac", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := sigsyaml.UnmarshalStrict(b, obj); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}
	role.Namespace, binding.Namespace = ns, ns
	rbac := kubeClient().RbacV1()
	if _, err := rbac.Roles(ns).Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.RoleBindings(ns).Create(ctx, &binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
