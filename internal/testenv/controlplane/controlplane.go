package controlplane

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/freeport"
	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// NodeServiceCIDR is the Services' address range of a control plane with a node.
const NodeServiceCIDR = "198.18.0.0/24"

// The controller's identity in a cluster, from config/rbac.
const (
	ControllerNamespace      = "student-controller-system"
	ControllerServiceAccount = "student-controller"
)

// Env is a running control plane with the Student CRD installed.
type Env struct {
	// Config reaches the API server as a cluster administrator (a static token of
	// the group system:masters).
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for the same administrator, for
	// kubectl and for the controller binary.
	Kubeconfig string
	// Root is the repository's root folder.
	Root string
	// Dir holds the control plane's state: etcd's data, the API server's certificates
	// and keys, the kubeconfig files and the logs.
	Dir string
	// Etcd, APIServer and ControllerManager are the processes; ControllerManager is
	// nil without one. StartEtcd and StartAPIServer start a stopped one again, on the
	// same data, certificates and keys.
	Etcd, APIServer, ControllerManager *proc.Process

	etcdURL, apiURL string
	apiServerSpec   proc.Spec
	removeDir       bool
	forNode         bool
}

// Options say how to run a control plane. The zero value keeps its state in a
// temporary folder that Stop removes, as tests want.
type Options struct {
	// Root is the repository's root folder, where bin/k8s and config/crd are; found
	// from this source file when empty.
	Root string
	// Dir keeps the state across runs when set (make run); a temporary folder, which
	// Stop removes, when empty.
	Dir string
	// WithoutAdmissionPolicy leaves out config/admission, which Start installs
	// otherwise, as config/default does in a cluster.
	WithoutAdmissionPolicy bool
	// WithoutCRD leaves out the CRD of config/crd, which Start installs otherwise: for
	// a chart that installs its own (make cluster).
	WithoutCRD bool
	// WithoutControllerManager runs no kube-controller-manager (the chaos suite's
	// faults strike the API server and etcd alone), or not yet: StartControllerManager
	// starts it later.
	WithoutControllerManager bool
	// APIServerFlags are set on kube-apiserver's command line, over the defaults:
	// flag name (without dashes) to value, e.g. {"watch-cache": "false"}.
	APIServerFlags map[string]string
	// NodeAddress readies the control plane for a node (package node) with this
	// address: the API server listens there, where the Pods reach it through the
	// kubernetes Service, ServiceAccounts get their tokens mounted, Services get
	// addresses from NodeServiceCIDR, and kube-controller-manager runs what Pods,
	// Deployments, Services and volumes need (NodeControllers).
	NodeAddress string
}

// Start starts etcd, kube-apiserver and kube-controller-manager from bin/k8s, installs
// the CRDs from config/crd/bases and the admission policy from config/admission (unless
// opts leave them out), and
// writes a kubeconfig. It never downloads anything: when the binaries are missing it
// says how to build them. The processes are this package's own (not envtest's), so
// that each can be stopped and started again on the same data, certificates and keys.
// Call Stop when done.
func Start(opts Options) (*Env, error) {
	root := opts.Root
	if root == "" {
		var err error
		if root, err = testenv.RepoRoot(); err != nil {
			return nil, err
		}
	}
	bin := filepath.Join(root, "bin", "k8s")
	binaries := []string{"etcd", "kube-apiserver", "kube-controller-manager"}
	if opts.WithoutControllerManager {
		binaries = binaries[:2]
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("control plane binary %s is missing (run `make controlplane` first): %w", b, err)
		}
	}
	// envtest, which installs the CRD, logs through controller-runtime's logger: its
	// progress lines are not ours to show (its errors come back as errors), and while
	// no logger is set it prints a stack trace once the program is 30 s old. The first
	// logger set is the one controller-runtime keeps: a program that set its own keeps it.
	ctrllog.SetLogger(logr.Discard())
	e := &Env{Root: root, Dir: opts.Dir}
	if e.Dir == "" {
		dir, err := os.MkdirTemp("", "student-controller-controlplane-")
		if err != nil {
			return nil, err
		}
		e.Dir, e.removeDir = dir, true
	}
	if err := e.start(context.Background(), bin, opts); err != nil {
		return nil, errors.Join(err, e.Stop())
	}
	return e, nil
}

// ForTest starts a control plane for one test (flags of its own, or a CRD it
// deletes) and stops it when the test ends.
func ForTest(tb testenv.TB, opts Options) *Env {
	tb.Helper()
	e, err := Start(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := e.Stop(); err != nil {
			tb.Errorf("stop the control plane: %v", err)
		}
	})
	return e
}

func (e *Env) start(ctx context.Context, bin string, opts Options) error {
	ports := make([]int, 3)
	for i := range ports {
		var err error
		if ports[i], err = freeport.Get(); err != nil {
			return err
		}
	}
	e.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	apiAddress := "127.0.0.1"
	if opts.NodeAddress != "" {
		apiAddress = opts.NodeAddress
	}
	e.apiURL = "https://" + net.JoinHostPort(apiAddress, strconv.Itoa(ports[2]))
	e.Etcd = proc.New(proc.Spec{
		Name: "etcd",
		Path: filepath.Join(bin, "etcd"),
		Args: []string{
			"--data-dir", filepath.Join(e.Dir, "etcd"),
			"--listen-client-urls", e.etcdURL, "--advertise-client-urls", e.etcdURL,
			"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
			// A SIGKILL loses nothing that reached the kernel; only a lost machine would.
			"--unsafe-no-fsync",
		},
		Log: filepath.Join(e.Dir, "etcd.log"),
	})

	certDir := filepath.Join(e.Dir, "apiserver")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	saKey := filepath.Join(certDir, "sa.key")
	if err := keep(saKey, newRSAKey); err != nil {
		return err
	}
	tokens := filepath.Join(certDir, "tokens.csv")
	if err := keep(tokens, func() ([]byte, error) {
		token, err := randomToken()
		return []byte(token + `,admin,admin,"system:masters"` + "\n"), err
	}); err != nil {
		return err
	}
	flags := map[string]string{
		"etcd-servers": e.etcdURL,
		// Its self-made certificate names this address, and the kubernetes Service's
		// first address and names.
		"bind-address": apiAddress,
		"secure-port":  strconv.Itoa(ports[2]),
		"cert-dir":     certDir,
		// The administrator's static token; ServiceAccounts get theirs from the
		// TokenRequest API, signed with the kept key.
		"token-auth-file": tokens,
		// On SIGTERM, end open watches within 5 s, as clusters set it; by default a
		// graceful stop waits out the 60 s request timeout for every open watch.
		"shutdown-watch-termination-grace-period": "5s",
		"authorization-mode":                      "RBAC",
		"allow-privileged":                        "true",
		"service-cluster-ip-range":                "10.0.0.0/24",
		"service-account-issuer":                  e.apiURL,
		"service-account-key-file":                saKey,
		"service-account-signing-key-file":        saKey,
		// No ServiceAccount controller runs to make the default ServiceAccounts.
		"disable-admission-plugins": "ServiceAccount",
	}
	if opts.NodeAddress != "" {
		// kube-proxy drops this machine's new connections to any address of the range
		// that no Service has: a range from the one set aside for benchmarks (RFC 2544),
		// which no network of this machine's uses.
		flags["service-cluster-ip-range"] = NodeServiceCIDR
		// Pods get their ServiceAccount's token mounted, and the controller manager
		// makes each namespace's default ServiceAccount.
		delete(flags, "disable-admission-plugins")
		// kubectl logs and exec reach the kubelet at the node's address (no DNS
		// here knows the node's name).
		flags["kubelet-preferred-address-types"] = "InternalIP"
	}
	maps.Copy(flags, opts.APIServerFlags)
	var args []string
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		args = append(args, "--"+name+"="+flags[name])
	}
	e.apiServerSpec = proc.Spec{Name: "kube-apiserver", Path: filepath.Join(bin, "kube-apiserver"), Args: args,
		Log: filepath.Join(e.Dir, "kube-apiserver.log")}
	e.APIServer = proc.New(e.apiServerSpec)

	if err := e.StartEtcd(ctx); err != nil {
		return err
	}
	if err := e.StartAPIServer(ctx); err != nil {
		return err
	}
	// The serving certificate is the API server's own, made at its first start.
	ca, err := os.ReadFile(filepath.Join(certDir, "apiserver.crt"))
	if err != nil {
		return fmt.Errorf("the API server's self-made certificate: %w", err)
	}
	token, err := os.ReadFile(tokens)
	if err != nil {
		return err
	}
	adminToken, _, _ := strings.Cut(string(token), ",")
	e.Config = &rest.Config{Host: e.apiURL, BearerToken: adminToken, TLSClientConfig: rest.TLSClientConfig{CAData: ca}, QPS: 1000, Burst: 2000}
	e.Kubeconfig = filepath.Join(e.Dir, "kubeconfig")
	if err := writeKubeconfig(e.Kubeconfig, "admin", e.Config); err != nil {
		return err
	}
	if !opts.WithoutCRD {
		if _, err := envtest.InstallCRDs(e.Config, envtest.CRDInstallOptions{
			Paths: []string{filepath.Join(e.Root, "config", "crd", "bases")}, ErrorIfPathMissing: true,
		}); err != nil {
			return fmt.Errorf("install the CRD: %w", err)
		}
	}
	e.forNode = opts.NodeAddress != ""
	if !opts.WithoutControllerManager {
		if err := e.StartControllerManager(); err != nil {
			return err
		}
	}
	if !opts.WithoutAdmissionPolicy {
		if err := e.InstallAdmissionPolicy(ctx); err != nil {
			return err
		}
	}
	return nil
}

// StartEtcd starts etcd (again) and waits until it is healthy.
func (e *Env) StartEtcd(ctx context.Context) error {
	if err := e.Etcd.Start(); err != nil {
		return err
	}
	return waitHealthy(ctx, e.Etcd, e.etcdURL+"/health")
}

// StartAPIServer starts kube-apiserver (again) and waits until it is ready.
func (e *Env) StartAPIServer(ctx context.Context) error {
	if err := e.APIServer.Start(); err != nil {
		return err
	}
	return waitHealthy(ctx, e.APIServer, e.apiURL+"/readyz")
}

// RestartAPIServer stops kube-apiserver and starts it again on the same data with
// extra arguments after Start's (none: as Start ran it), and waits until it is ready.
// The bench turns an alpha feature gate on so for the contenders that need it.
func (e *Env) RestartAPIServer(ctx context.Context, extra ...string) error {
	if err := e.APIServer.Stop(30 * time.Second); err != nil {
		return fmt.Errorf("stop kube-apiserver: %w", err)
	}
	spec := e.apiServerSpec
	spec.Args = slices.Concat(spec.Args, extra)
	e.APIServer = proc.New(spec)
	return e.StartAPIServer(ctx)
}

// WaitReady waits until kube-apiserver is ready (after etcd came back, say).
func (e *Env) WaitReady(ctx context.Context) error {
	return waitHealthy(ctx, e.APIServer, e.apiURL+"/readyz")
}

// waitHealthy polls url until it answers 200, p exits, or two minutes pass. The
// health endpoints answer anyone; the probe checks no certificate, since the first
// start of the API server is what makes it.
func waitHealthy(ctx context.Context, p *proc.Process, url string) error {
	client := &http.Client{
		Timeout:   2 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}, // #nosec G402 -- a local health probe, before the self-made certificate exists
	}
	var last error
	healthy, err := p.WaitUntil(ctx, 2*time.Minute, func() bool {
		resp, err := client.Get(url)
		if last = err; err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if err == nil && !healthy {
		err = fmt.Errorf("%s not healthy at %s within 2 minutes (last: %v); its log %s ends:\n%s", p.Name(), url, last, p.LogPath(), p.Tail(20))
	}
	return err
}

// StartControllerManager starts kube-controller-manager from bin/k8s and waits until
// its controllers work: Start does, unless Options.WithoutControllerManager said not to
// (make run starts it once it is built).
func (e *Env) StartControllerManager() error {
	if e.ControllerManager != nil {
		return errors.New("kube-controller-manager runs already")
	}
	p, err := startControllerManager(filepath.Join(e.Root, "bin", "k8s", "kube-controller-manager"), e.Kubeconfig, e.Dir, e.forNode)
	if err != nil {
		return err
	}
	e.ControllerManager = p
	return nil
}

// ControllerManagerLog is the path of kube-controller-manager's log.
func (e *Env) ControllerManagerLog() string { return e.ControllerManager.LogPath() }

// Stop stops the control plane, and removes its folder unless Options.Dir named it.
func (e *Env) Stop() error {
	var errs []error
	for _, p := range []struct {
		p     *proc.Process
		grace time.Duration
	}{{e.ControllerManager, 10 * time.Second}, {e.APIServer, 30 * time.Second}, {e.Etcd, 30 * time.Second}} {
		if p.p != nil {
			errs = append(errs, p.p.Stop(p.grace))
		}
	}
	if e.removeDir {
		errs = append(errs, os.RemoveAll(e.Dir))
	}
	return errors.Join(errs...)
}

// InstallRBAC applies config/rbac, exactly as shipped, with kubectl.
func (e *Env) InstallRBAC(ctx context.Context) error {
	if err := testenv.EnsureNamespace(ctx, kubernetes.NewForConfigOrDie(e.Config), ControllerNamespace); err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", e.Kubeconfig, // #nosec G204 -- kubectl on this control plane
		"apply", "-k", filepath.Join(e.Root, "config", "rbac")).CombinedOutput()
	if err != nil {
		return fmt.Errorf("kubectl apply -k config/rbac: %v\n%s", err, out)
	}
	return nil
}

// Identity is a ServiceAccount's credentials: a rest.Config and a kubeconfig file.
type Identity struct {
	Config     *rest.Config
	Kubeconfig string
}

// ServiceAccount creates the ServiceAccount namespace/name if needed and returns
// credentials for it: a token from the TokenRequest API, as a Pod gets, valid for a
// day.
func (e *Env) ServiceAccount(ctx context.Context, namespace, name string) (*Identity, error) {
	sas := kubernetes.NewForConfigOrDie(e.Config).CoreV1().ServiceAccounts(namespace)
	if _, err := sas.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	tr, err := sas.CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To(int64((24 * time.Hour).Seconds()))},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("token for %s/%s: %w", namespace, name, err)
	}
	id := &Identity{
		Config: &rest.Config{Host: e.Config.Host, BearerToken: tr.Status.Token,
			TLSClientConfig: rest.TLSClientConfig{CAData: e.Config.CAData}, QPS: 100, Burst: 200},
		Kubeconfig: filepath.Join(e.Dir, namespace+"-"+name+".kubeconfig"),
	}
	return id, writeKubeconfig(id.Kubeconfig, name, id.Config)
}

func writeKubeconfig(path, user string, cfg *rest.Config) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["local"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos[user] = &clientcmdapi.AuthInfo{Token: cfg.BearerToken}
	kc.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: user}
	kc.CurrentContext = "local"
	return clientcmd.WriteToFile(*kc, path)
}

// keep writes what make makes to path, unless path exists: a control plane whose
// state is kept (make run) keeps its keys and its administrator's token.
func keep(path string, make func() ([]byte, error)) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	b, err := make()
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

func newRSAKey() ([]byte, error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
