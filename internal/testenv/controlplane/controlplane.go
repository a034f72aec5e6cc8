package controlplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/student-controller/student-controller/internal/testenv"
	"github.com/student-controller/student-controller/internal/testenv/proc"
)

// Env is a running control plane with the Student CRD installed.
type Env struct {
	// Config reaches the API server as a cluster administrator.
	Config *rest.Config
	// Kubeconfig is the path of a kubeconfig file for the same administrator, for
	// kubectl and for the controller binary.
	Kubeconfig string
	// Root is the repository's root folder.
	Root string

	env *envtest.Environment
	dir string
	kcm *proc.Process
}

// Options say where a control plane keeps its state. The zero value keeps it in
// temporary folders that Stop removes, as tests want.
type Options struct {
	// Root is the repository's root folder, where bin/k8s and config/crd are; found
	// from this source file when empty.
	Root string
	// EtcdDataDir keeps etcd's data across runs when set.
	EtcdDataDir string
	// Kubeconfig is where to write the kubeconfig; a temporary file when empty.
	Kubeconfig string
	// LogDir is where kube-controller-manager's log goes; a temporary folder when empty.
	LogDir string
	// WithoutAdmissionPolicy leaves out config/admission, which Start installs
	// otherwise, as config/default does in a cluster.
	WithoutAdmissionPolicy bool
	// APIServerFlags are set on kube-apiserver's command line, over the defaults:
	// flag name (without dashes) to value, e.g. {"watch-cache": "false"}.
	APIServerFlags map[string]string
}

// Start starts etcd, kube-apiserver and kube-controller-manager from bin/k8s, installs
// the CRDs from config/crd/bases and the admission policy from config/admission, and
// writes a kubeconfig. It never downloads anything:
// when the binaries are missing it says how to build them. Call Stop when done.
func Start(opts Options) (*Env, error) {
	root := opts.Root
	if root == "" {
		var err error
		if root, err = testenv.RepoRoot(); err != nil {
			return nil, err
		}
	}
	assets := filepath.Join(root, "bin", "k8s")
	for _, bin := range []string{"kube-apiserver", "etcd", "kube-controller-manager"} {
		if _, err := os.Stat(filepath.Join(assets, bin)); err != nil {
			return nil, fmt.Errorf("control plane binary %s is missing (run `make controlplane` first): %w", bin, err)
		}
	}
	// KUBEBUILDER_ASSETS and TEST_ASSET_* would silently swap in other binaries;
	// USE_EXISTING_CLUSTER would test someone's cluster instead. Neither is wanted.
	for _, name := range []string{"KUBEBUILDER_ASSETS", "TEST_ASSET_KUBE_APISERVER", "TEST_ASSET_ETCD"} {
		if v, ok := os.LookupEnv(name); ok {
			return nil, fmt.Errorf("environment variable %s=%q is set; unset it so the tests use bin/k8s", name, v)
		}
	}

	env := &envtest.Environment{
		BinaryAssetsDirectory:    assets,
		CRDDirectoryPaths:        []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing:    true,
		UseExistingCluster:       ptr.To(false),
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	for flag, value := range opts.APIServerFlags {
		env.ControlPlane.GetAPIServer().Configure().Set(flag, value)
	}
	if opts.EtcdDataDir != "" {
		if err := os.MkdirAll(opts.EtcdDataDir, 0o700); err != nil {
			return nil, err
		}
		env.ControlPlane.Etcd = &envtest.Etcd{DataDir: opts.EtcdDataDir}
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("start control plane: %w", err)
	}
	e := &Env{Config: cfg, Root: root, env: env}

	e.Kubeconfig = opts.Kubeconfig
	if e.Kubeconfig == "" || opts.LogDir == "" {
		e.dir, err = os.MkdirTemp("", "student-controller-controlplane-")
	}
	if e.Kubeconfig == "" {
		e.Kubeconfig = filepath.Join(e.dir, "kubeconfig")
	}
	if err == nil {
		err = os.WriteFile(e.Kubeconfig, env.KubeConfig, 0o600)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("write kubeconfig: %w", err), e.Stop())
	}
	logDir := opts.LogDir
	if logDir == "" {
		logDir = e.dir
	}
	if e.kcm, err = startControllerManager(filepath.Join(assets, "kube-controller-manager"), e.Kubeconfig, logDir); err != nil {
		return nil, errors.Join(err, e.Stop())
	}
	if !opts.WithoutAdmissionPolicy {
		if err := e.InstallAdmissionPolicy(context.Background()); err != nil {
			return nil, errors.Join(err, e.Stop())
		}
	}
	return e, nil
}

// ControllerManagerLog is the path of kube-controller-manager's log.
func (e *Env) ControllerManagerLog() string { return e.kcm.LogPath() }

// Stop stops the control plane and removes its temporary files.
func (e *Env) Stop() error {
	var err error
	if e.kcm != nil {
		err = e.kcm.Stop(10 * time.Second)
	}
	err = errors.Join(err, e.env.Stop())
	if e.dir != "" {
		err = errors.Join(err, os.RemoveAll(e.dir))
	}
	return err
}
