package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/student-controller/student-controller/internal/testenv"
)

// The controller's identity in a cluster, from config/rbac.
const (
	systemNamespace = "student-controller-system"
	serviceAccount  = "student-controller"
)

// identity is a ServiceAccount's credentials: a rest.Config and a kubeconfig file.
type identity struct {
	config     *rest.Config
	kubeconfig string
}

// installRBAC applies config/rbac, exactly as shipped, with kubectl.
func installRBAC(ctx context.Context) error {
	if err := testenv.EnsureNamespace(ctx, kubeClient(), systemNamespace); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", env.Kubeconfig,
		"apply", "-k", filepath.Join(env.Root, "config", "rbac")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply -k config/rbac: %v\n%s", err, out)
	}
	return nil
}

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

// serviceAccountIdentity creates the ServiceAccount if needed and returns credentials
// for it: a token from the TokenRequest API, as a Pod would get.
func serviceAccountIdentity(ctx context.Context, namespace, name, dir string) (*identity, error) {
	sas := kubeClient().CoreV1().ServiceAccounts(namespace)
	if _, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	tr, err := sas.CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64(2 * time.Hour / time.Second))},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	cfg := &rest.Config{
		Host:            env.Config.Host,
		BearerToken:     tr.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: env.Config.CAData},
		QPS:             100, Burst: 200,
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: name}
	kc.CurrentContext = "test"
	path := filepath.Join(dir, namespace+"-"+name+".kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return nil, err
	}
	return &identity{config: cfg, kubeconfig: path}, nil
}
