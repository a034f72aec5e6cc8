package chaos

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/controlplane"
	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// The controller's identity, from config/rbac.
const (
	systemNamespace = "student-controller-system"
	serviceAccount  = "student-controller"
)

// cluster is etcd and kube-apiserver from bin/k8s, run by the harness itself rather
// than by envtest: a restart must find the same data, certificates and keys, and
// envtest makes new certificates at every start and deletes its data on Stop. The API
// server makes its own serving certificate in its cert folder and keeps it; the
// administrator logs in with a static token, the controller with a ServiceAccount token
// that the kept signing key keeps valid.
type cluster struct {
	root string
	dir  string

	etcd      *proc.Process
	apiserver *proc.Process
	etcdURL   string
	apiURL    string

	// admin reaches the API server as a cluster administrator.
	admin *rest.Config
	// adminKubeconfig and controllerKubeconfig are kubeconfig files for kubectl and for
	// the controller (config/rbac's ServiceAccount).
	adminKubeconfig      string
	controllerKubeconfig string
}

// startCluster starts etcd and kube-apiserver in dir and installs what config/default
// installs but the Deployment: the CRD, the admission policy, the RBAC.
func startCluster(ctx context.Context, root, dir string) (*cluster, error) {
	bin := filepath.Join(root, "bin", "k8s")
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("control plane binary %s is missing (run `make controlplane` first): %w", b, err)
		}
	}
	ports := make([]int, 3)
	for i := range ports {
		var err error
		if ports[i], err = testenv.FreePort(); err != nil {
			return nil, err
		}
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	c := &cluster{
		root:    root,
		dir:     dir,
		etcdURL: etcdURL,
		apiURL:  fmt.Sprintf("https://127.0.0.1:%d", ports[2]),
		etcd: proc.New(proc.Spec{
			Name: "etcd",
			Path: filepath.Join(bin, "etcd"),
			Args: []string{
				"--data-dir", filepath.Join(dir, "etcd"),
				"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
				"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
				// A SIGKILL loses nothing that reached the kernel; only a lost machine would.
				"--unsafe-no-fsync",
			},
			Log: filepath.Join(dir, "etcd.log"),
		}),
	}

	certDir := filepath.Join(dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	saKey := filepath.Join(certDir, "sa.key")
	if err := writeRSAKey(saKey); err != nil {
		return nil, err
	}
	adminToken, err := randomToken()
	if err != nil {
		return nil, err
	}
	tokens := filepath.Join(certDir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(adminToken+`,chaos-admin,chaos-admin,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, err
	}
	c.apiserver = proc.New(proc.Spec{
		Name: "kube-apiserver",
		Path: filepath.Join(bin, "kube-apiserver"),
		Args: []string{
			"--etcd-servers", etcdURL,
			"--bind-address", "127.0.0.1", // and its self-made certificate names 127.0.0.1
			"--secure-port", strconv.Itoa(ports[2]),
			"--cert-dir", certDir,
			"--token-auth-file", tokens,
			// On SIGTERM, end open watches within 5 s, as clusters set it; by default a
			// graceful stop waits out the 60 s request timeout for every open watch.
			"--shutdown-watch-termination-grace-period", "5s",
			"--authorization-mode", "RBAC",
			"--service-cluster-ip-range", "10.0.0.0/24",
			"--service-account-issuer", c.apiURL,
			"--service-account-key-file", saKey,
			"--service-account-signing-key-file", saKey,
			// No ServiceAccount controller runs to make the default ServiceAccounts.
			"--disable-admission-plugins", "ServiceAccount",
		},
		Log: filepath.Join(dir, "kube-apiserver.log"),
	})

	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.startAPIServer(ctx); err != nil {
		return nil, err
	}
	// The serving certificate is the API server's own, with its CA after it.
	ca, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
	if err != nil {
		return nil, fmt.Errorf("the API server's self-made certificate: %w", err)
	}
	c.admin = &rest.Config{Host: c.apiURL, BearerToken: adminToken, TLSClientConfig: rest.TLSClientConfig{CAData: ca}, QPS: 500, Burst: 1000}
	if c.adminKubeconfig, err = writeKubeconfig(filepath.Join(dir, "admin.kubeconfig"), c.admin); err != nil {
		return nil, err
	}
	if err := c.install(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// install installs the CRD, the admission policy and config/rbac, and writes the
// controller's kubeconfig with a token of its ServiceAccount.
func (c *cluster) install(ctx context.Context) error {
	if _, err := envtest.InstallCRDs(c.admin, envtest.CRDInstallOptions{
		Paths: []string{filepath.Join(c.root, "config", "crd", "bases")}, ErrorIfPathMissing: true,
	}); err != nil {
		return fmt.Errorf("install the CRD: %w", err)
	}
	if err := controlplane.InstallAdmissionPolicy(ctx, c.admin, c.root); err != nil {
		return err
	}
	if err := testenv.EnsureNamespace(ctx, kubernetes.NewForConfigOrDie(c.admin), systemNamespace); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", c.adminKubeconfig, "apply", "-k", filepath.Join(c.root, "config", "rbac")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply -k config/rbac: %v\n%s", err, out)
	}
	sas := kubernetes.NewForConfigOrDie(c.admin).CoreV1().ServiceAccounts(systemNamespace)
	tr, err := sas.CreateToken(ctx, serviceAccount, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64((6 * time.Hour).Seconds()))},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("token for %s/%s: %w", systemNamespace, serviceAccount, err)
	}
	c.controllerKubeconfig, err = writeKubeconfig(filepath.Join(c.dir, "controller.kubeconfig"),
		&rest.Config{Host: c.apiURL, BearerToken: tr.Status.Token, TLSClientConfig: c.admin.TLSClientConfig})
	return err
}

// startEtcd starts etcd and waits until it is healthy.
func (c *cluster) startEtcd(ctx context.Context) error {
	if err := c.etcd.Start(); err != nil {
		return err
	}
	return waitHealthy(ctx, c.etcd, c.etcdURL+"/health")
}

// startAPIServer starts kube-apiserver and waits until it is ready.
func (c *cluster) startAPIServer(ctx context.Context) error {
	if err := c.apiserver.Start(); err != nil {
		return err
	}
	return waitHealthy(ctx, c.apiserver, c.apiURL+"/readyz")
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

// stop stops both; the folder stays for the caller to keep or remove.
func (c *cluster) stop() error {
	err := c.apiserver.Stop(30 * time.Second)
	if etcdErr := c.etcd.Stop(30 * time.Second); err == nil {
		err = etcdErr
	}
	return err
}

// waitHealthy polls url until it answers 200, p exits, or two minutes pass. The
// health endpoints answer anyone; the probe checks no certificate, since the first
// start of the API server is what makes it.
func waitHealthy(ctx context.Context, p *proc.Process, url string) error {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, //nolint:gosec // a local health probe
	}
	var last error
	healthy, err := p.WaitUntil(ctx, 2*time.Minute, func() bool {
		resp, err := client.Get(url)
		if last = err; err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err == nil && !healthy {
		err = fmt.Errorf("%s not healthy at %s within 2 minutes (last: %v)", p.Name(), url, last)
	}
	return err
}

func writeRSAKey(path string) error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600)
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func writeKubeconfig(path string, cfg *rest.Config) (string, error) {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["chaos"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["chaos"] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["chaos"] = &clientcmdapi.Context{Cluster: "chaos", AuthInfo: "chaos"}
	kc.CurrentContext = "chaos"
	return path, clientcmd.WriteToFile(*kc, path)
}
