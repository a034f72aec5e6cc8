package chaos

import (
	"context"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
)

// cluster is a chaos run's control plane, without kube-controller-manager, kept in the
// run's folder: the faults stop and start its etcd and kube-apiserver on the same data,
// certificates and keys. admin is its administrator at the loader's client limits;
// controllerKubeconfig is the controller's ServiceAccount, with config/rbac's RBAC.
type cluster struct {
	*controlplane.Env
	admin                *rest.Config
	controllerKubeconfig string
}

// startCluster starts a control plane in dir and installs what config/crd and
// config/default install but the Deployment: the CRD, the admission policy, the RBAC.
func startCluster(ctx context.Context, root, dir string) (*cluster, error) {
	env, err := controlplane.Start(controlplane.Options{Root: root, Dir: dir, WithoutControllerManager: true})
	if err != nil {
		return nil, err
	}
	c := &cluster{Env: env, admin: rest.CopyConfig(env.Config)}
	c.admin.QPS, c.admin.Burst = 500, 1000
	if err := env.InstallRBAC(ctx); err != nil {
		return c, err
	}
	id, err := env.ServiceAccount(ctx, controlplane.ControllerNamespace, controlplane.ControllerServiceAccount)
	if err != nil {
		return c, err
	}
	c.controllerKubeconfig = id.Kubeconfig
	return c, nil
}

// studentWrites is how many write requests to Students (and their status) the API
// server has answered since it started, from its own metrics.
func (c *cluster) studentWrites(ctx context.Context) (int, error) {
	body, err := kubernetes.NewForConfigOrDie(c.admin).CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	return int(testenv.MetricSum(string(body), "apiserver_request_total", func(labels string) bool {
		if !strings.Contains(labels, `group="bolingcavalry.k8s.io"`) {
			return false
		}
		for _, read := range []string{`verb="GET"`, `verb="LIST"`, `verb="WATCH"`} {
			if strings.Contains(labels, read) {
				return false
			}
		}
		return true
	})), nil
}
